"""The dashboard fuzzed: any state the reducer makes, from events that decode, is drawn and driven
through every pane and screen (the plots view's tabs too) under Textual's pilot without an exception
(8 examples, a Textual app each, about 9 s apiece here: CI runs the suite within its hour)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from fuzzing import EXTREMES, _drive, encode, event_objects, fuzz, write_log
from hypothesis import given
from hypothesis import strategies as st

from gkd_tui.sources.replay import ReplaySource


@pytest.mark.slow
@fuzz(8)
@given(objs=st.lists(event_objects(hostile=False), min_size=1, max_size=40),
       size=st.sampled_from([(80, 24), (160, 48)]))
def test_the_dashboard_shows_any_state_the_reducer_makes(objs, size):
    from gkd_tui.app import GkdApp

    lines = [encode(dict(obj, seq=i, ts=obj.get("ts", 1000.0 + i))) for i, obj in enumerate(EXTREMES + objs, 1)]
    with tempfile.TemporaryDirectory() as d:
        app = GkdApp(ReplaySource(write_log(Path(d), lines)))
        asyncio.run(_drive(app, size))  # an exception in any pane or screen is raised here
