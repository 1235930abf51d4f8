import pytest
import torch

from gkd_core.trainer import loss as L


def full_kl(p_logits, q_logits):
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def setup(v=12, k=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(3, 5, v, generator=g) * 2
    t = torch.randn(3, 5, v, generator=g) * 2
    t_logp = torch.log_softmax(t, -1)
    top = t_logp.topk(k or v, dim=-1)
    return s, t, top.indices, top.values


def test_equals_the_full_vocabulary_reference_when_k_is_the_vocabulary():
    s, t, ids, lp = setup()
    fwd = L.token_divergence(s, ids, lp, loss="forward_kl")
    rev = L.token_divergence(s, ids, lp, loss="reverse_kl")
    assert torch.allclose(fwd, full_kl(t, s), atol=1e-5)
    assert torch.allclose(rev, full_kl(s, t), atol=1e-5)
    m = torch.log(0.5 * torch.softmax(t, -1) + 0.5 * torch.softmax(s, -1))
    lt, ls = torch.log_softmax(t, -1), torch.log_softmax(s, -1)
    jsd_ref = 0.5 * (lt.exp() * (lt - m)).sum(-1) + 0.5 * (ls.exp() * (ls - m)).sum(-1)
    assert torch.allclose(L.token_divergence(s, ids, lp, loss="jsd", beta=0.5), jsd_ref, atol=1e-5)


def test_beta_0_and_1_are_the_two_kls():
    s, _, ids, lp = setup(k=5)
    assert torch.allclose(L.token_divergence(s, ids, lp, loss="jsd", beta=0.0),
                          L.token_divergence(s, ids, lp, loss="forward_kl"))
    assert torch.allclose(L.token_divergence(s, ids, lp, loss="jsd", beta=1.0),
                          L.token_divergence(s, ids, lp, loss="reverse_kl"))


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("k", [3, 12])
def test_zero_for_identical_distributions(loss, k):
    _, t, ids, lp = setup(k=k)
    d = L.token_divergence(t, ids, lp, loss=loss, beta=0.3)
    assert d.abs().max() < 1e-5


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
def test_never_negative_and_the_tail_counts(loss):
    for seed in range(20):
        s, _, ids, lp = setup(k=4, seed=seed)
        assert (L.token_divergence(s, ids, lp, loss=loss, beta=0.7) >= -1e-6).all()
    # a student that matches the teacher on its top-k ranks but moves the tail mass is penalised
    _, t, ids, lp = setup(k=4)
    moved = t.clone()
    moved.scatter_(-1, ids, moved.gather(-1, ids) + 1.0)  # more mass on the top-k, less on the tail
    assert (L.token_divergence(moved, ids, lp, loss=loss) > 1e-4).all()


def test_masking_and_normalisation():
    ids = torch.tensor([[2, 5, 3, 7, 8, 1, 0, 0], [2, 5, 3, 7, 1, 9, 9, 9]])
    mask = L.completion_mask(ids, prompt_len=3, eos_id=1)
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0, 0, 0]]
    s, _, tid, lp = setup(v=12)
    s, tid, lp = s[:2, :4].repeat(1, 2, 1), tid[:2, :4].repeat(1, 2, 1), lp[:2, :4].repeat(1, 2, 1)
    per = L.token_divergence(s, tid, lp, loss="forward_kl")
    got = L.distill_loss(s, tid, lp, mask, loss="forward_kl")
    assert torch.allclose(got, (per * mask).sum() / 5)
    assert torch.allclose(L.distill_loss(s, tid, lp, mask, n_tokens=10, loss="forward_kl"), (per * mask).sum() / 10)


def test_gradients_flow_to_the_student_only_through_its_logits():
    s, _, ids, lp = setup(k=4)
    s.requires_grad_(True)
    L.distill_loss(s, ids, lp, torch.ones(3, 5), loss="jsd").backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
