"""Runs that last days: a skipped non-finite step, the stop after several, checkpoints that fit."""

from __future__ import annotations

from gkd_core.diagnosis.rules.common import BAD_STEP_SHOWN
from gkd_core.state import RunState
from gkd_core.supervisor import alerts
from gkd_core.telemetry import events as ev
from gkd_core.trainer import checkpoints


def _ckpt(root, step, complete=True, size=10):
    d = root / f"step_{step:06d}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x" * size)
    if complete:
        (d / "COMPLETE").write_text("")
    return d


def test_prune_keeps_the_newest_complete_and_deletes_torn_older_ones(tmp_path):
    for s in (2, 4, 6, 8):
        _ckpt(tmp_path, s)
    _ckpt(tmp_path, 5, complete=False)  # torn, older than the newest complete: goes
    _ckpt(tmp_path, 10, complete=False)  # torn, newer: may be the save under way, stays
    (tmp_path / "step_000003.bak").mkdir()  # a copy set aside by hand: not the trainer's to delete
    gone = checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == ["step_000002", "step_000004", "step_000005"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003.bak", "step_000006", "step_000008",
                                                           "step_000010"]
    assert checkpoints.latest(tmp_path).name == "step_000008"  # never the torn one
    assert checkpoints.prune(tmp_path, keep=0) == []  # 0 keeps all


def test_a_run_taken_over_says_which_steps_its_checkpoint_holds_and_its_log_lost(tmp_path):
    from gkd_core.supervisor.drivers import LOST_STEPS, steps_the_log_lost

    assert steps_the_log_lost(tmp_path, 70, 123) == ""  # no checkpoint yet
    _ckpt(tmp_path / "checkpoints", 70)
    assert steps_the_log_lost(tmp_path, 70, 123) == ""  # the log has every step the checkpoint holds
    _ckpt(tmp_path / "checkpoints", 110)
    _ckpt(tmp_path / "checkpoints", 120, complete=False)  # a save torn by the kill holds nothing
    said = steps_the_log_lost(tmp_path, 70, 123)
    assert said.startswith("the log lost steps 71-109: checkpoint step_000110 holds step 110, and the log has "
                           "steps only to 70;") and "supervisor pid 123 was gone" in said, said
    assert LOST_STEPS.match(said).groups() == ("71", "109")
    assert steps_the_log_lost(tmp_path, 108, 0).startswith("the log lost step 109: ")
    assert LOST_STEPS.match(steps_the_log_lost(tmp_path, 108, 0)).groups() == ("109", None)
    # the checkpoint's own step is not lost: the driver that resumes from it says its metrics again
    assert steps_the_log_lost(tmp_path, 109, 0) == ""
    (tmp_path / "checkpoints" / "step_000130.bak").mkdir()  # copied aside by hand, COMPLETE and all
    (tmp_path / "checkpoints" / "step_000130.bak" / "COMPLETE").write_text("")
    assert steps_the_log_lost(tmp_path, 70, 123).startswith("the log lost steps 71-109: ")  # not the copy


def test_fits_compares_the_free_space_with_the_last_checkpoint(tmp_path):
    assert checkpoints.fits(tmp_path, 1000, checkpoints.FakeFreeSpace(1300)) == (True, 1300)
    assert checkpoints.fits(tmp_path, 1000, checkpoints.FakeFreeSpace(1100)) == (False, 1100)
    free = checkpoints.DiskFreeSpace().free_bytes(tmp_path)
    assert free > 0 and checkpoints.fits(tmp_path, 0, checkpoints.DiskFreeSpace())[0]


def test_a_skipped_step_raises_an_alert_with_seed_004s_fixes():
    st = RunState()
    for step in (1, 2, 3):
        st.apply(ev.MetricsEvent(step=step, loss=0.5, skipped=step == 2, bad_steps=int(step >= 2), ts=float(step)))
    (a,) = [a for a in alerts.evaluate(st, 10.0, 10.0) if a.code == "bad_step"]
    assert "step 2 skipped" in a.message and a.targets == ["student/0"]
    assert "actor.lr" in a.hint and "max_grad_norm" in a.hint and "bfloat16" in a.hint
    st.apply(ev.MetricsEvent(step=2 + BAD_STEP_SHOWN, loss=0.4, ts=99.0))
    assert not [a for a in alerts.evaluate(st, 100.0, 10.0) if a.code == "bad_step"]
