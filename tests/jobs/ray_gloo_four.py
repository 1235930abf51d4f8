"""A plain Ray job, unmodified by gkd: four actors in one gloo process group broadcast a tensor from rank
0, round after round; rank 2 skips the broadcast of round 3 (a rank that took another branch) and sleeps
instead, while its three peers wait inside it. The Flight Recorder is on (gkd turns it on for a watched
job unless the job set it), so the run reads each rank's last collective from it."""

import os
import sys
import tempfile
import time

import ray


@ray.remote(num_cpus=0)
class Ranker:
    def __init__(self, rank: int, world: int, rendezvous: str):
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world,
                                timeout=timedelta(seconds=600))
        self.rank = rank

    def round(self, n: int) -> int:
        import torch
        import torch.distributed as dist

        if n == 3 and self.rank == 2:
            time.sleep(3600)  # the line its stack must show: it never calls the broadcast of round 3
        t = torch.full((1024,), float(n))
        dist.broadcast(t, src=0)
        return int(t[0])


if __name__ == "__main__":
    ray.init(num_cpus=2)
    rendezvous = f"file://{tempfile.mkdtemp()}/rendezvous"
    rankers = [Ranker.remote(r, 4, rendezvous) for r in range(4)]
    for n in range(1, 6):
        print("ROUND", n, ray.get([r.round.remote(n) for r in rankers], timeout=3600), flush=True)
    sys.exit(0 if os.environ.get("GKD_RUN_ID") else 1)
