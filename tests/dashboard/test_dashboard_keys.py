"""A snapshot per key sequence a user presses (the BINDINGS of the app, the workers table and the
screens), on the recorded hang_demo run at the moment of ``test_main_screen_snapshot``."""

from __future__ import annotations

import pytest
from test_dashboard import RECORDING, near_timeout_ts, seek_to

from gkd_tui.app import GkdApp
from gkd_tui.sources.replay import ReplaySource

WIDE, NARROW = (120, 36), (80, 24)
# (name, keys, terminal size), all at the moment of test_main_screen_snapshot: rollout/1, the
# straggler, is the row under the rollout group's line; the cursor starts on that line
KEY_SEQUENCES = [
    ("help", ["question_mark"], WIDE),
    ("help-narrow", ["question_mark"], NARROW),
    ("details-of-the-straggler", ["down", "enter"], WIDE),
    ("details-of-the-straggler-narrow", ["down", "enter"], NARROW),
    ("cancel-offers-the-stragglers-task", ["down", "c"], WIDE),
    ("cancel-on-a-group-line-narrow", ["c"], NARROW),  # the sync or everything: no worker is selected
    ("enter-folds-the-rollout-group", ["enter"], WIDE),
    ("filter-being-typed", ["slash", *"rollout"], WIDE),
    ("filter-applied", ["slash", *"rollout", "enter"], WIDE),
    ("end-of-the-replay", ["end"], WIDE),
    ("plots-training", ["p"], WIDE),
    ("plots-sync-narrow", ["p", "2"], NARROW),
    ("plots-step-time", ["p", "3"], WIDE),
]


@pytest.fixture
def steady_cursor(monkeypatch):
    """A text cursor that never blinks off, so that a snapshot does not depend on when it is taken."""
    from textual.widgets import Input, TextArea

    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
    monkeypatch.setattr(TextArea, "_toggle_cursor_blink_visible", lambda self: None)


@pytest.mark.parametrize("keys, size", [k[1:] for k in KEY_SEQUENCES], ids=[k[0] for k in KEY_SEQUENCES])
def test_key_sequence_snapshot(snap_compare, steady_cursor, keys, size):
    app = GkdApp(ReplaySource(RECORDING))
    assert snap_compare(app, press=keys, terminal_size=size, run_before=seek_to(near_timeout_ts()))


def test_d_and_r_in_a_replay_are_refused_in_a_warning_snapshot(snap_compare):
    """D and r ask the run's supervisor; a replay has none, and says so instead of a dialog."""
    async def run_before(pilot):
        await seek_to(near_timeout_ts())(pilot)
        for key in ("D", "r"):
            await pilot.press(key)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
    assert snap_compare(GkdApp(ReplaySource(RECORDING)), terminal_size=WIDE, run_before=run_before)


def test_the_restart_dialog_snapshot(snap_compare, steady_cursor):
    """What r opens on a live run at this moment: the supervisor's dry run (its answer for this
    recording, as gkd_core's restart plan gives it), with focus on Cancel."""
    from gkd_core.telemetry.answers import Restarted
    from gkd_tui.screens.confirm import restart_dialog

    dry = Restarted(restart=1, changes=[("rollout.n_workers", 2, 1,
                                         "straggler rollout/1: run without it, one rollout worker fewer")])

    async def run_before(pilot):
        await seek_to(near_timeout_ts())(pilot)
        await pilot.app.push_screen(restart_dialog(dry))
    assert snap_compare(GkdApp(ReplaySource(RECORDING)), terminal_size=WIDE, run_before=run_before)


def test_the_stack_viewer_snapshot(snap_compare, steady_cursor):
    """What D opened when the run was recorded: every worker's stack, grouped, the named one first
    (a replay cannot take stacks: the recording's own dump "all" is shown)."""
    from gkd_tui.screens.stacks import StackScreen

    async def run_before(pilot):
        await seek_to(near_timeout_ts())(pilot)
        st = pilot.app.source.state
        stacks = {t: r for t, r in st.stacks.items() if r.dump_id == "all"}
        named = frozenset(t for a in st.alerts.values() for t in a.targets)
        assert len(stacks) == 6 and named == {"rollout/1"}
        await pilot.app.push_screen(StackScreen(stacks, "all", named))
    assert snap_compare(GkdApp(ReplaySource(RECORDING)), terminal_size=WIDE, run_before=run_before)
