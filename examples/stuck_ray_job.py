"""An ordinary Ray job with no gkd imports: of its two rollout workers, one never finishes its weight
sync while the other returns from it at once.

    python examples/stuck_ray_job.py &        # the job
    gkd-tui attach --ray-address auto         # what gkd-tui sees of it, through the Ray state API

This is the seeds' hang as any Ray user meets it: `ray.get` on a sync that never returns.
"""

import time

import ray


@ray.remote(num_cpus=0, max_concurrency=2)
class RolloutWorker:
    def generate(self, n: int) -> list[int]:
        return list(range(n))

    def sync_rollout_weights(self, step: int, hang: bool = False) -> bool:
        if hang:
            time.sleep(3600)  # the broadcast whose peer is gone
        return True


@ray.remote(num_cpus=0)
class Trainer:
    def train_step(self, step: int) -> float:
        time.sleep(0.1)
        return 1.0 / (step + 1)


if __name__ == "__main__":
    ray.init()  # joins RAY_ADDRESS when set, else starts a local cluster
    trainer = Trainer.remote()
    workers = [RolloutWorker.remote() for _ in range(2)]
    for step in range(3):
        ray.get([w.generate.remote(8) for w in workers], timeout=60)
        ray.get(trainer.train_step.remote(step), timeout=60)
    print("step 3: syncing weights", flush=True)
    refs = [w.sync_rollout_weights.remote(3, hang=i == 1) for i, w in enumerate(workers)]
    ray.get(refs)  # waits forever: the seeds' hang
