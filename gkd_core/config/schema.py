"""The config's sections and keys, each with its default: the embedded tiny CPU demo."""

from __future__ import annotations

from typing import Literal

import msgspec


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    """The student."""

    path: str = ""  # a Hugging Face model folder; empty: the built-in tiny student
    trust_remote_code: bool = False  # run the model folder's own Python code (only for folders you trust)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, ~30 % slower
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class TeacherConfig(_Section):
    path: str = ""  # empty: the built-in teacher, prepared once and cached under GKD_HOME
    trust_remote_code: bool = False
    address: str = ""  # tcp://host:port of a running teacher proxy; empty with launch=true
    launch: bool = True
    n_server_workers: int = 1
    num_microbatches: int = 2
    max_in_flight: int = 4
    topk: int = 16
    # what the teacher's workers score with: Hugging Face torch, or vLLM's prompt_logprobs (trainer/vllm_teacher.py)
    engine: Literal["torch", "vllm"] = "torch"
    request_timeout_s: float = 30.0
    max_retries: int = 3


class RolloutConfig(_Section):
    n_workers: int = 2
    engine: Literal["torch", "vllm"] = "torch"
    max_new_tokens: int = 16
    temperature: float = 1.0
    gpu_memory_utilization: float = 0.5


class ActorConfig(_Section):
    lr: float = 3e-3
    micro_batch_size: int = 16
    loss: Literal["forward_kl", "reverse_kl", "jsd"] = "jsd"
    beta: float = 0.5
    temperature: float = 1.0
    max_grad_norm: float = 1.0  # gradients clipped to this norm (verl's grad_clip); 0: not clipped


class DataConfig(_Section):
    files: list[str] = []  # JSON lines, JSON or Parquet (verl's RL files as they are); empty: the built-in task
    val_files: list[str] = []  # held-out prompts; empty: eval_prompts are held out of `files`
    prompt_key: str = "prompt"  # a list of chat messages (rendered with the chat template) or a string
    max_prompt_length: int = 1024  # in tokens
    truncation: Literal["drop", "left", "error"] = "drop"  # a longer prompt: dropped, cut from the left, or an error
    batch_size: int = 32
    eval_prompts: int = 64
    seed: int = 0  # the order of the prompts, shuffled anew every epoch


class TrainerConfig(_Section):
    total_steps: int = 60
    scheduler: Literal["sync", "one_step_off"] = "one_step_off"
    sync_timeout_s: float = 60.0
    init_timeout_s: float = 300.0
    step_timeout_s: float = 300.0
    checkpoint_every: int = 10
    eval_every: int = 10  # held-out prompts evaluated every N steps (and before the first and after the last)
    keep_checkpoints: int = 3  # the newest N complete checkpoints are kept (verl's max_actor_ckpt_to_keep); 0: all
    # a rollout worker that dies (killed, or stopped by the recovery: a frozen one) is started again in its place
    # and the run goes on: the group made anew, the student's weights synced to it, the step's generation sent
    # again. Off: the run fails, and a restart resumes from the newest checkpoint (the teacher's workers are
    # always started again)
    replace_rollouts: bool = False
    max_bad_steps: int = 3  # this many steps in a row with a non-finite loss or gradient stop the run
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # where each step's metrics go besides the run's log (trainer/loggers.py): its driver's log, TensorBoard's event
    # files in RUN/tensorboard, a W&B run in RUN/wandb (offline without an API key); the last two: the loggers extra
    logger: list[Literal["console", "tensorboard", "wandb"]] = msgspec.field(default_factory=lambda: ["console"])
    # environment of the driver and every worker (Ray's runtime_env), e.g. NCCL_DEBUG: INFO
    env: dict[str, str] = {}
    # Ray custom resources each role's actors ask for (student, rollout, teacher): they land on the
    # nodes started with them, e.g. {rollout: {gen: 0.01}} and `ray start --resources '{"gen": 1}'`
    placement: dict[str, dict[str, float]] = {}


class TelemetryConfig(_Section):
    heartbeat_s: float = 1.0
    # events.jsonl keeps a quiet worker's heartbeat this often, and every one that changes something
    # a rule reads (idle CPU, dropped events, RSS); 0 keeps every heartbeat
    heartbeat_log_s: float = 10.0
    # the supervisor writes a keyframe of its state (RUN/keyframes/) each time events.jsonl has grown by this
    # much (or by the last keyframe's own size, when larger), so that a replay of a long recording starts near
    # where it is asked to be; 0: none
    keyframe_mb: float = 32.0
    stall_s: float = 10.0  # a heartbeat older than this raises a `heartbeat_stale` alert
    bind_host: str = "127.0.0.1"  # where the teacher server (and, across nodes, the tcp ingest) listen; a loopback
    # address is replaced by Ray's address for the node when the cluster has several; never 0.0.0.0 unless set
    control_tcp: str = ""  # host:port for an authenticated (CurveZMQ) tcp control socket; off when empty
    events_tcp: str = ""  # host:port for a tcp copy of the PUB socket; off when empty
    pub_hwm: int = 100_000  # events queued per subscriber before a slow one misses some (and resnapshots)


class AgentConfig(_Section):
    enabled: bool = True  # one node agent per Ray node: GPU readings and stacks of local workers
    gpu_backend: str = "nvml"  # nvml, or the test backend: fake:gpus=2,hang_at=3
    gpu_interval_s: float = 2.0
    nvml_deadline_s: float = 3.0  # an NVML call not back by then is flagged (nvml_hung_s)
    stack_timeout_s: float = 3.0  # per process; a dump_stacks answers within this plus a margin
    ray_poll_s: float = 5.0  # how often the driver asks Ray's state API about its actors; 0: never


class FaultConfig(_Section):
    kind: Literal[
        "hang_sync", "hang_generate", "delay_teacher", "kill_teacher", "kill_worker", "hold_gil", "hang_nvml",
        "nan_grad", "disk_full", "oom", "slow_worker", "stop_in_sync", "skip_weight_push", "slow_sync_part",
        "error_teacher", "grow_memory",
    ]
    target: str = ""  # a worker's src, e.g. "rollout/1"
    step: int = 1  # the training step; for hang_nvml, the GPU sample that never returns
    # how long a delay, a GIL hold, a hang, a slowness, a leak or a run of errors lasts; 0: forever (a hang, errors)
    # or from its step on (a slowness, a leak)
    seconds: float = 0.0
    repeat: int = 1  # nan_grad (always the student's), disk_full: this many steps in a row, from `step`
    factor: float = 0.0  # slow_worker: each generation from `step` on takes this much longer (0.3: 30 %)
    mb_per_s: float = 0.0  # grow_memory: the worker's memory grows this fast from `step` on (a leak), for `seconds`
    # slow_sync_part: the part of the sync after `step` that takes `seconds` longer on `target`
    # (vocab.TRAINER_SYNC_PARTS, as a test checks; `load` on a vLLM engine: inside the engine's own workers)
    part: Literal["", "gather", "broadcast", "load", "reset_cache", "verify"] = ""


class RecoveryConfig(_Section):
    """Recovery without a person (DESIGN §14; supervisor/recovery.py): off while ``restart_on`` is empty."""

    restart_on: list[str] = []  # alert codes: a critical one held grace_s restarts the run (bug report first)
    grace_s: float = 60.0  # how long such an alert holds before the restart
    per_hour: int = 3  # restarts in any hour; past that, none, and a critical alert says so
    backoff_s: float = 30.0  # the wait after a restart before the next, doubled each time within the hour


class ShrinkRule(_Section):
    key: str
    factor: float = 0.5
    floor: float = 1


def _default_shrink() -> list[ShrinkRule]:
    # From the seeds: fewer rollout workers, halved batch and micro batch, shorter generations,
    # lower engine memory use.
    return [
        ShrinkRule(key="rollout.n_workers", factor=0.5, floor=1),
        ShrinkRule(key="data.batch_size", factor=0.5, floor=4),
        ShrinkRule(key="actor.micro_batch_size", factor=0.5, floor=2),
        ShrinkRule(key="rollout.max_new_tokens", factor=0.5, floor=8),
        ShrinkRule(key="rollout.gpu_memory_utilization", factor=0.8, floor=0.3),
    ]


class Config(_Section):
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    teacher: TeacherConfig = msgspec.field(default_factory=TeacherConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    actor: ActorConfig = msgspec.field(default_factory=ActorConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    recovery: RecoveryConfig = msgspec.field(default_factory=RecoveryConfig)
    faults: list[FaultConfig] = []
    shrink: list[ShrinkRule] = msgspec.field(default_factory=_default_shrink)
