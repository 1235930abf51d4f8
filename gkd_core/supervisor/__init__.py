"""The supervisor: one small, robust process per run. It imports neither torch nor ray."""
