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
whose methods are the roles' with their prefixes, ``actor_rollout_generate_sequences``, ``ref_...``). With
``JOB_TEACHER=1`` each step scores its sequences with a teacher through verl's own teacher loop client
(``AsyncTeacherLLMServerManager``, in an async worker as verl's agent loop holds it) against a teacher
server actor; with ``JOB_TEACHER_STALL_STEP=N`` the server never answers from step N on. With
``JOB_CHECKPOINT_ENGINE=1`` each step's weights go to rollout servers through verl's own
``CheckpointEngineManager.update_weights`` (its steps: abort, free the KV cache, build the group, update,
finalize, restore, resume) with a backend of the job's, ``job_cpu``, over two server actors; with
``JOB_SLOW_RELEASE_STEP=N`` server 1 never frees its KV cache at step N.
"""

import asyncio
import os
import sys
import tempfile
import time
from types import SimpleNamespace

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
TEACHER = os.environ.get("JOB_TEACHER") == "1"
TEACHER_STALL_STEP = int(os.environ.get("JOB_TEACHER_STALL_STEP", "0"))
CHECKPOINT_ENGINE = os.environ.get("JOB_CHECKPOINT_ENGINE") == "1"
SLOW_RELEASE_STEP = int(os.environ.get("JOB_SLOW_RELEASE_STEP", "0"))
SERVERS = 2
SEQUENCES = 4  # scored by the teacher each step


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
    def update_weights(self, global_steps=None, mode="job_cpu"):
        time.sleep(0.05)  # the weights sent to the servers (verl's engines send them bucket by bucket)
        return {"weights_sent": float(self.weights[0])}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method, *args, **kwargs):
        return {"rank": self.rank} if method == "prepare" else None

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


@ray.remote(num_cpus=0)
class TeacherServer:
    """A teacher's inference server as verl's teacher loop asks it: each prompt token's log-probability (here
    under a tiny torch model; verl's are vLLM or SGLang servers)."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))

    async def generate(self, prompt_ids: list[int], step: int) -> dict:
        if TEACHER_STALL_STEP and step >= TEACHER_STALL_STEP:
            await asyncio.Event().wait()  # a request the server never answers
        ids = torch.tensor(prompt_ids) % 64
        with torch.no_grad():
            logp = torch.log_softmax(self.model(ids), -1).gather(1, ids[:, None])
        return {"prompt_ids": [[int(t)] for t in prompt_ids], "prompt_logprobs": logp.tolist()}


class TeacherClient:
    """The call verl's ``LLMServerClient.generate`` makes, to one server actor (verl's balances many)."""

    def __init__(self, server, step: list[int]):
        self.server, self.step = server, step

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_) -> SimpleNamespace:
        return SimpleNamespace(extra_fields=await self.server.generate.remote(prompt_ids, self.step[0]))


@ray.remote(num_cpus=0)
class TeacherLoopWorker:
    """The teacher part of verl's agent-loop worker: verl's ``AsyncTeacherLLMServerManager`` over the client."""

    def __init__(self, server):
        from omegaconf import OmegaConf
        from verl.experimental.teacher_loop.teacher_manager import AsyncTeacherLLMServerManager

        config = OmegaConf.create({"distillation": {
            "_target_": "verl.workers.config.DistillationConfig",
            "teacher_models": {"teacher_model": {"_target_": "verl.workers.config.DistillationTeacherModelConfig"}},
            "distillation_loss": {"_target_": "verl.workers.config.DistillationLossConfig", "loss_mode": "k3"}}})
        self.step = [0]
        self.manager = AsyncTeacherLLMServerManager(config, {"teacher_model": TeacherClient(server, self.step)})

    async def score(self, step: int, sequences: list[list[int]]) -> list[int]:
        self.step[0] = step
        scored = await asyncio.gather(*(self.manager.compute_teacher_logprobs_single(s) for s in sequences))
        return [int(logprobs.shape[0]) for _, logprobs in scored]


@ray.remote(num_cpus=0)
class RolloutServer:
    """A rollout server's worker as verl's checkpoint engine drives it: the manager's replica steps and the
    worker group's ``update_weights`` / ``execute_checkpoint_engine`` (verl's CheckpointEngineWorker's)."""

    def __init__(self, index: int):
        self.index = index

    def abort_all_requests(self, reject_request: bool = False):
        time.sleep(0.01)

    def release_kv_cache(self, step: int):
        if self.index == 1 and step == SLOW_RELEASE_STEP:
            time.sleep(3600)  # the engine never frees its cache: the line its stack must show
        time.sleep(0.01)

    def update_weights(self, global_steps=None):
        time.sleep(0.05)

    def execute_checkpoint_engine(self, method, *args, **kwargs):
        return {"rank": self.index} if method == "prepare" else None

    def resume_kv_cache(self):
        time.sleep(0.01)

    def resume_generation(self):
        pass


class Replica:
    """The part of verl's ``RolloutReplica`` the manager uses: its workers, and the steps around a sync."""

    def __init__(self, server, step: list[int]):
        self.server, self.workers, self.step = server, [server], step

    async def abort_all_requests(self, reject_request: bool = False):
        await self.server.abort_all_requests.remote(reject_request)

    async def release_kv_cache(self):
        await self.server.release_kv_cache.remote(self.step[0])

    async def resume_kv_cache(self):
        await self.server.resume_kv_cache.remote()

    async def resume_generation(self):
        await self.server.resume_generation.remote()


def checkpoint_manager(wg, step: list[int]):
    """verl's CheckpointEngineManager over the trainer's worker group and two servers, with the job's backend
    (the transfer itself is the job's stand-in; the manager's steps and their order are verl's)."""
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineManager, CheckpointEngineRegistry
    from verl.workers.config import CheckpointEngineConfig

    if "job_cpu" not in CheckpointEngineRegistry._registry:
        @CheckpointEngineRegistry.register("job_cpu")
        class JobCpuEngine(CheckpointEngine):
            @classmethod
            def build_topology(cls, trainer_world_size, rollout_world_size, metadata):
                return {}, {}

            def prepare(self):
                return {}

            def init_process_group(self, **kwargs):
                pass

            def finalize(self):
                pass

            async def send_weights(self, weights, global_steps=None):
                pass

            async def receive_weights(self, global_steps=None):
                return
                yield  # an async generator, as verl's are

    replicas = [Replica(RolloutServer.remote(i), step) for i in range(SERVERS)]
    return CheckpointEngineManager(CheckpointEngineConfig(backend="job_cpu"), wg, replicas)


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
    teacher = TeacherLoopWorker.remote(TeacherServer.remote()) if TEACHER else None
    step_now = [0]
    manager = checkpoint_manager(wg, step_now) if CHECKPOINT_ENGINE else None
    tracker = Tracking(project_name="gkd-shape", experiment_name="cpu", default_backend="console")
    for step in range(1, STEPS + 1):
        timing = {}
        with marked_timer("step", timing):
            with marked_timer("gen", timing):
                ray.get(wg.generate_sequences())
            if teacher is not None:
                with marked_timer("teacher", timing):
                    sequences = [[step, i, i + 1, i + 2] for i in range(SEQUENCES)]
                    assert ray.get(teacher.score.remote(step, sequences)) == [4] * SEQUENCES
            if ref is not None:
                with marked_timer("ref", timing):
                    ray.get(ref.compute_ref_log_prob())
            with marked_timer("update_actor", timing):
                out = ray.get(wg.update_actor())
            with marked_timer("update_weights", timing):
                synced = ray.get(wg.sync_rollout_weights())
                if manager is not None:
                    step_now[0] = step
                    manager.update_weights(global_steps=step)
        assert synced == [float(step)] * WORLD, synced
        tracker.log({**out[0], **{f"timing_s/{k}": v for k, v in timing.items()}}, step=step)
    print("VERL JOB DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
