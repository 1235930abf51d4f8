"""Where a dashboard's events come from: a live run (ZeroMQ) or a recorded one (replay)."""
