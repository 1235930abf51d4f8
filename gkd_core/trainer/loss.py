"""Distillation losses on the teacher's top-k, with a tail bucket for the mass outside it.

Both distributions are reduced to k+1 buckets: the teacher's top-k token ids and one "tail"
bucket holding everything else (1 - the top-k mass, computed in log space). So nothing is
silently clamped away, and with k = vocab the tail is empty and the losses equal the
full-vocabulary ones. Positions on the prompt and after EOS are masked; the sum is divided
by the number of completion tokens.
"""

from __future__ import annotations

import math

import torch

# log of the smallest tail mass we represent: an empty tail (k = vocab, or every other token at
# probability 0 in float32) is this instead of log 0, whose gradient is inf and, times 0, NaN
_TAIL_FLOOR = -60.0


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, accurate near 0 and near -inf. For constants only (the teacher's
    tail): its gradient is infinite at x = 0."""
    x = x.clamp(max=0.0)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def bucket_logprobs(logp_topk: torch.Tensor) -> torch.Tensor:
    """[..., k] log-probs of the top-k -> [..., k+1] with the tail bucket appended (no gradient
    through the tail: use it for the teacher, whose log-probs are data)."""
    tail = _log1mexp(torch.logsumexp(logp_topk.detach(), dim=-1, keepdim=True)).clamp(min=_TAIL_FLOOR)
    return torch.cat([logp_topk, tail], dim=-1)


def student_buckets(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[..., V] logits -> [..., k+1] log-probs of the tokens ``ids`` and of all the others.

    The tail is summed over the other tokens' own logits (a logsumexp with the top-k left out), not
    taken as 1 - the top-k mass: once the student is confident that difference is 0 in float32 and
    its log has an infinite gradient. The left-out entries are set to a floor e^-60 below the total,
    so an empty tail is the floor, finite, with a zero gradient.
    """
    z = logits.float() / temperature
    total = torch.logsumexp(z, dim=-1, keepdim=True)
    top = torch.gather(z, -1, ids) - total
    floor = (total.detach() + _TAIL_FLOOR - math.log(ids.shape[-1])).expand_as(ids)
    tail = torch.logsumexp(z.scatter(-1, ids, floor), dim=-1, keepdim=True) - total
    return torch.cat([top, tail], dim=-1)


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis, 0·log 0 = 0."""
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p)).sum(-1)


def token_divergence(student_logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_logp: torch.Tensor,
                     loss: str = "jsd", beta: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """Per-token divergence [B, T] between the student and the teacher's top-k (+ tail).

    ``student_logits`` [B, T, V]; ``teacher_ids``/``teacher_logp`` [B, T, k] (teacher log-probs of its
    top-k tokens). ``loss``: forward_kl = KL(teacher || student), reverse_kl = KL(student || teacher),
    jsd = generalized JSD(beta) with M = beta·teacher + (1-beta)·student; beta=0 is forward KL and
    beta=1 reverse KL (as in TRL's GKD).
    """
    s = student_buckets(student_logits, teacher_ids, temperature)
    t = bucket_logprobs(teacher_logp.float())
    if loss == "forward_kl" or (loss == "jsd" and beta == 0.0):
        return _kl(t, s)
    if loss == "reverse_kl" or (loss == "jsd" and beta == 1.0):
        return _kl(s, t)
    if loss != "jsd":
        raise ValueError(f"unknown loss {loss!r}: forward_kl, reverse_kl or jsd")
    log_m = torch.logaddexp(t + math.log(beta), s + math.log(1 - beta))
    return beta * _kl(t, log_m) + (1 - beta) * _kl(s, log_m)


def completion_mask(input_ids: torch.Tensor, prompt_len: int, eos_ids: int | list[int]) -> torch.Tensor:
    """[B, T] 1.0 on completion tokens up to and including the first EOS (any of ``eos_ids``), 0 on
    the prompt and after."""
    b, t = input_ids.shape
    pos = torch.arange(t, device=input_ids.device).expand(b, t)
    eos = torch.as_tensor([eos_ids] if isinstance(eos_ids, int) else list(eos_ids), device=input_ids.device)
    is_eos = torch.isin(input_ids, eos) & (pos >= prompt_len)
    first_eos = torch.where(is_eos, pos, torch.full_like(pos, t)).min(dim=1, keepdim=True).values
    return ((pos >= prompt_len) & (pos <= first_eos)).float()


def attention(left_pad: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask, position ids), both [B, width], of rows left-padded by ``left_pad`` [B]
    tokens: the pads are masked and every row's first real token is at position 0, as in generation."""
    pos = torch.arange(width, device=left_pad.device).expand(len(left_pad), width)
    mask = (pos >= left_pad[:, None]).long()
    return mask, (mask.cumsum(-1) - 1).clamp(min=0)


def distill_loss(student_logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_logp: torch.Tensor,
                 mask: torch.Tensor, n_tokens: int | float | None = None, **kw) -> torch.Tensor:
    """Masked mean of ``token_divergence``: divided by ``n_tokens`` (the global count of
    completion tokens across micro batches) or by this mask's count."""
    per_token = token_divergence(student_logits, teacher_ids, teacher_logp, **kw)
    denom = n_tokens if n_tokens is not None else mask.sum().clamp(min=1.0)
    return (per_token * mask).sum() / denom
