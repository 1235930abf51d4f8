"""A verl-shaped GKD job, built from verl's own pieces on CPU and unmodified by gkd (verl's
``recipe/gkd`` does not import on verl 0.9, and ``main_ppo`` needs GPUs).

verl's ``RayResourcePool(use_gpu=False)`` and ``RayWorkerGroup``; worker methods declared with
``@register(Dispatch.ONE_TO_ALL, blocking=False)``; a trainer loop of ``marked_timer`` phases with
``Tracking`` metrics; ``sync_rollout_weights`` a real gloo broadcast from rank 0. With
``JOB_HANG_RANK=1`` that rank never finishes its sync at step ``JOB_HANG_STEP`` (it sleeps after the
broadcast, loading the weights into its engine), while rank 0 returns: seed 001's hang. With
``JOB_MAX_COLOCATE=10`` (verl's default) each worker asks 10 CPUs of a 4-CPU node: seed 003's
"workers never start". With ``JOB_FUSED=1`` the actor-rollout and the reference worker are fused into one
Ray actor per rank, as verl's trainer colocates its roles (``create_colocated_worker_cls``: a ``WorkerDict``
whose methods are the roles' with their prefixes, ``actor_rollout_generate_sequences``, ``ref_...``).
"""

import os
import sys
import tempfile
import time

import ray
import torch
import torch.distributed as dist
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import create_colocated_worker_cls
from verl.utils.profiler import marked_timer
from verl.utils.tracking import Tracking

HANG_RANK = int(os.environ.get("JOB_HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("JOB_HANG_STEP", "3"))
STEPS = int(os.environ.get("JOB_STEPS", "6"))
WORLD = int(os.environ.get("JOB_WORLD", "2"))
COLOCATE = int(os.environ.get("JOB_MAX_COLOCATE", "1"))
FUSED = os.environ.get("JOB_FUSED") == "1"


@ray.remote
class ActorRolloutWorker(Worker):
    def __init__(self):
        super().__init__()
        self.weights = torch.zeros(4096)
        self.step = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self, store: str):
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=self.rank, world_size=self.world_size)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def generate_sequences(self):
        time.sleep(0.3)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def update_actor(self):
        self.step += 1
        if self.rank == 0:
            self.weights += 1.0
        time.sleep(0.2)
        return {"actor/pg_loss": 1.0 / self.step}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sync_rollout_weights(self):
        dist.broadcast(self.weights, src=0)
        if self.rank == HANG_RANK and self.step == HANG_STEP:
            time.sleep(3600)  # the engine never takes the weights: the line its stack must show
        return float(self.weights[0])


@ray.remote
class RefWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def compute_ref_log_prob(self):
        time.sleep(0.1)
        return self.rank


def main() -> int:
    ray.init(num_cpus=4, include_dashboard=os.environ.get("JOB_DASHBOARD") == "1")
    pool = RayResourcePool([WORLD], use_gpu=False, max_colocate_count=COLOCATE)
    print("asking for the pool", flush=True)
    ref = None
    if FUSED:  # one actor a rank holding both roles, as verl's trainer makes them
        fused = create_colocated_worker_cls({"actor_rollout": RayClassWithInitArgs(cls=ActorRolloutWorker),
                                             "ref": RayClassWithInitArgs(cls=RefWorker)})
        groups = RayWorkerGroup(pool, fused).spawn(prefix_set={"actor_rollout", "ref"})
        wg, ref = groups["actor_rollout"], groups["ref"]
    else:
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ActorRolloutWorker))
    store = tempfile.mktemp(prefix="verl-gkd-store-")
    ray.get(wg.init_model(store))
    tracker = Tracking(project_name="gkd-shape", experiment_name="cpu", default_backend="console")
    for step in range(1, STEPS + 1):
        timing = {}
        with marked_timer("step", timing):
            with marked_timer("gen", timing):
                ray.get(wg.generate_sequences())
            if ref is not None:
                with marked_timer("ref", timing):
                    ray.get(ref.compute_ref_log_prob())
            with marked_timer("update_actor", timing):
                out = ray.get(wg.update_actor())
            with marked_timer("update_weights", timing):
                synced = ray.get(wg.sync_rollout_weights())
        assert synced == [float(step)] * WORLD, synced
        tracker.log({**out[0], **{f"timing_s/{k}": v for k, v in timing.items()}}, step=step)
    print("VERL JOB DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
