"""A plain Ray job, unmodified by gkd: two pairs of actors that call each other, healthy for a while, then each
pair deadlocked the way RL jobs deadlock across their components.

- Calls: Trainer.step asks Inference.generate for samples and waits in ray.get; Inference.generate asks
  Trainer.weights_ready first and waits on it, queued behind the step still running (prime-rl #3016's shape).
- A collective: Rollout.pull waits in a gloo broadcast from Learner; Learner.push sends it only after a ray.get
  on Rollout.ready, queued behind the pull (AReaL #1439's: one side in SEND, the other never in RECV).

Healthy rounds make the same calls in an order that returns (each waited-on actor is free when asked).

    python ray_deadlock.py HEALTHY_S [calls|collective|both]   # healthy rounds for HEALTHY_S seconds, then the
                                                                 # deadlock of the calls, the collective's, or both
"""

import sys
import tempfile
import time
from datetime import timedelta

import ray
from ray.util.placement_group import placement_group

WAIT_S = 3600  # every wait of the job has a bound; the deadlock holds until the run is stopped


@ray.remote(num_cpus=0)
class Trainer:
    def connect(self, inference) -> None:
        self.inference = inference

    def step(self, n: int, deadlock: bool) -> int:
        time.sleep(0.3)  # a step's work
        return ray.get(self.inference.generate.remote(n, ask_trainer=deadlock), timeout=WAIT_S)

    def weights_ready(self) -> bool:
        return True


@ray.remote(num_cpus=0)
class Inference:
    def __init__(self, trainer):
        self.trainer = trainer

    def generate(self, n: int, ask_trainer: bool) -> int:
        # asked from the trainer's own step, weights_ready waits behind that step; from the driver (the
        # healthy rounds), the trainer is free and answers
        if ask_trainer:
            ray.get(self.trainer.weights_ready.remote(), timeout=WAIT_S)
        time.sleep(0.3)
        return n


def join_group(rendezvous: str, rank: int) -> None:
    """The Learner (rank 0) and the Rollout (rank 1) in one gloo group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2,
                            timeout=timedelta(seconds=WAIT_S))


@ray.remote(num_cpus=0)
class Learner:
    def __init__(self, rendezvous: str):
        join_group(rendezvous, rank=0)

    def connect(self, rollout) -> None:
        self.rollout = rollout

    def push(self, n: int, deadlock: bool) -> int:
        import torch
        import torch.distributed as dist

        if deadlock:  # asks the rollout first, which is inside the broadcast this push has not sent
            ray.get(self.rollout.ready.remote(), timeout=WAIT_S)
        dist.broadcast(torch.full((1024,), float(n)), src=0)
        return n


@ray.remote(num_cpus=0)
class Rollout:
    def __init__(self, rendezvous: str):
        join_group(rendezvous, rank=1)

    def ready(self) -> bool:
        return True

    def pull(self, n: int) -> int:
        import torch
        import torch.distributed as dist

        t = torch.zeros(1024)
        dist.broadcast(t, src=0)
        return int(t[0])


if __name__ == "__main__":
    healthy_s = float(sys.argv[1])
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    if which not in ("calls", "collective", "both"):
        sys.exit(f"ray_deadlock.py: no deadlock called {which!r}: calls, collective or both")
    ray.init(num_cpus=2)
    # the rollout's share of the node reserved, as RL jobs do (a bug report lists it with its demand)
    rollout_group = placement_group([{"CPU": 1}], name="rollout-group")
    ray.get(rollout_group.ready(), timeout=60)
    trainer = Trainer.remote()
    inference = Inference.remote(trainer)
    rendezvous = f"file://{tempfile.mkdtemp()}/rendezvous"
    learner, rollout = Learner.remote(rendezvous), Rollout.remote(rendezvous)
    ray.get([trainer.connect.remote(inference), learner.connect.remote(rollout)], timeout=WAIT_S)
    n, until = 0, time.monotonic() + healthy_s
    while time.monotonic() < until:
        n += 1
        # each asks the other while the other is free: waits that return
        ray.get([inference.generate.remote(n, ask_trainer=True), rollout.ready.remote()], timeout=WAIT_S)
        ray.get([trainer.step.remote(n, deadlock=False), learner.push.remote(n, deadlock=False),
                 rollout.pull.remote(n)], timeout=WAIT_S)
    print("HEALTHY ROUNDS", n, flush=True)
    held = []
    if which in ("collective", "both"):
        pull = rollout.pull.remote(n + 1)
        time.sleep(1.0)  # the pull is inside its broadcast before the push asks the rollout anything
        held += [learner.push.remote(n + 1, deadlock=True), pull]
    print("DEADLOCK AT", time.time(), flush=True)
    if which in ("calls", "both"):
        held.append(trainer.step.remote(n + 1, deadlock=True))
    ray.get(held, timeout=WAIT_S)
