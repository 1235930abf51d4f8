"""The run log: ``RUN/events.jsonl`` and the keyframes beside it, written and read here only.

- ``eventlog``: the writer (append, flush, fsync) and the recovery of a torn last line;
- ``heartbeats``: which heartbeats go into the log (a quiet worker's now and then, every change);
- ``keyframes``: the state now and then, written from a forked child, trusted only for its own log;
- ``reader``: lines to events to a state: a whole log (``replay``), a run taken over (``take_over``);
- ``timeline``: the state at any moment, from a keyframe, with the left-out heartbeats put back
  (the dashboard's replay).
"""
