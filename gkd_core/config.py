"""The run configuration: YAML plus dotted ``key=value`` overrides, typed and validated.

Nothing starts on an invalid config: a bad key or value raises ``ConfigError`` naming the key
path, the value, where it came from (file or command line) and the nearest valid key.
The defaults of every field are the embedded tiny CPU demo, so ``load_config(None)`` is the
config that ``gkd-tui launch`` runs with no file.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    """The student."""

    name: str = "tiny-student"
    path: str = ""  # a Hugging Face model folder; empty: the built-in tiny student
    trust_remote_code: bool = False  # run the model folder's own Python code (only for folders you trust)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, ~30 % slower
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class TeacherConfig(_Section):
    model: str = "tiny-teacher"
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
    max_bad_steps: int = 3  # this many steps in a row with a non-finite loss or gradient stop the run
    device: Literal["auto", "cpu", "cuda"] = "auto"
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
    # much, so that a replay of a long recording starts near where it is asked to be; 0: none
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
        "nan_grad", "disk_full", "oom", "slow_worker", "stop_in_sync", "skip_weight_push",
    ]
    target: str = ""  # a worker's src, e.g. "rollout/1"
    step: int = 1  # the training step; for hang_nvml, the GPU sample that never returns
    seconds: float = 0.0  # how long a delay or GIL hold lasts; 0 for a hang means forever
    repeat: int = 1  # nan_grad (always the student's), disk_full: this many steps in a row, from `step`
    factor: float = 0.0  # slow_worker: each generation from `step` on takes this much longer (0.3: 30 %)


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
    faults: list[FaultConfig] = []
    shrink: list[ShrinkRule] = msgspec.field(default_factory=_default_shrink)


class ConfigError(ValueError):
    """A config that must not start: says the key path, the value, the source and a fix."""


def _valid_paths(cls: type = Config, prefix: str = "") -> list[str]:
    paths = []
    for f in msgspec.structs.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            paths.extend(_valid_paths(f.type, path + "."))
    return paths


def _nearest(path: str) -> str:
    candidates = _valid_paths()
    close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.5)
    if not close:  # compare the last component, which is what people usually mistype
        leaf = path.rsplit(".", 1)[-1]
        by_leaf = {p.rsplit(".", 1)[-1]: p for p in candidates}
        close = [by_leaf[m] for m in difflib.get_close_matches(leaf, by_leaf, n=1, cutoff=0.6)]
    return f"; did you mean '{close[0]}'?" if close else ""


class _YamlWithoutDates(yaml.SafeLoader):
    """``yaml.safe_load`` without dates: no config value is one, and a date that is none (2001-02-30)
    raises ValueError from inside the parser, where no key can be named. Read as strings, they are
    refused by the type check, which names the key."""


_YamlWithoutDates.add_constructor("tag:yaml.org,2002:timestamp", _YamlWithoutDates.construct_yaml_str)


def _load_yaml(text: str, where: str) -> Any:
    """YAML text -> Python values; ConfigError in one line (PyYAML's messages span several) saying
    where in ``where`` the problem is."""
    try:
        return yaml.load(text, Loader=_YamlWithoutDates)  # a SafeLoader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({e.context})" if e.context else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {e.problem}{context}") from None
    except yaml.YAMLError as e:  # the reader's: a character YAML does not allow, with its position
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid YAML: nested deeper than the parser goes") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from None


def _show(value: Any) -> str:
    """A value in an error message: its repr, cut (a message is one line, not a dump of the input)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"  # (repr of a 5,000-digit int raises)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_override(text: str) -> tuple[str, Any]:
    """``trainer.total_steps=10`` -> ("trainer.total_steps", 10); values are parsed as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise ConfigError(f"override {_show(text)} is not of the form key.path=value "
                          "(for example trainer.total_steps=10)")
    value = _load_yaml(raw, f"override {_show(text)}") if raw.strip() else ""
    return key, value


def _set_path(tree: dict, key: str, value: Any, source: str) -> None:
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set '{key}': '{'.'.join(parts[: i + 1])}' is not a section")
        node = child
    node[parts[-1]] = value


def _get_path(tree: Any, parts: list[str]) -> Any:
    for p in parts:
        if isinstance(tree, dict) and p in tree:
            tree = tree[p]
        elif isinstance(tree, list) and p.isdigit() and int(p) < len(tree):
            tree = tree[int(p)]
        else:
            return None
    return tree


def _check_keys(tree: Any, cls: type, prefix: str, sources: dict[str, str], default_source: str) -> None:
    """Unknown keys, with the nearest valid one (msgspec's own message lacks the suggestion)."""
    if not isinstance(tree, dict):
        return
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if key not in fields:
            src = sources.get(path, default_source)
            raise ConfigError(f"{src}: unknown key '{path}' (value {_show(value)}){_nearest(path)}")
        ftype = fields[key].type
        if isinstance(ftype, type) and issubclass(ftype, msgspec.Struct):
            _check_keys(value, ftype, path + ".", sources, default_source)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (or the embedded default when ``path`` is None) and apply overrides."""
    source = str(path) if path else "the embedded default"
    tree: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist (run with no config for the embedded CPU demo)")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); a config is a YAML file") from None
        loaded = _load_yaml(text, str(p))
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        tree = loaded
    return _from_tree(tree, overrides, source)


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...], source: str = "restart") -> Config:
    """A new config: ``cfg`` with dotted overrides applied and validated again."""
    return _from_tree(msgspec.to_builtins(cfg), overrides, source)


def _from_tree(tree: dict, overrides: list[str] | tuple[str, ...], source: str) -> Config:
    sources: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        _set_path(tree, key, value, f"override {_show(text)}")
        sources[key] = f"override {_show(text)}"
    _check_keys(tree, Config, "", sources, source)
    env = tree.get("trainer", {}).get("env") if isinstance(tree.get("trainer"), dict) else None
    if isinstance(env, dict):  # NCCL_IB_DISABLE: 1 in YAML is meant as the string "1"
        tree["trainer"]["env"] = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}
    try:
        cfg = msgspec.convert(tree, Config)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = re.search(r"at `\$\.?([^`]*)`", msg)
        where = m.group(1).replace("[", ".").replace("]", "") if m else ""
        value = _get_path(tree, where.split(".")) if where else None
        src = sources.get(where, source)
        reason = msg.split(" - at ")[0]
        raise ConfigError(f"{src}: bad value for '{where or '(top level)'}': {_show(value)}: {reason}") from None
    _check_numbers(msgspec.to_builtins(cfg), "", sources, source)
    _check_semantics(cfg, source)
    return cfg


def _check_numbers(tree: Any, path: str, sources: dict[str, str], source: str) -> None:
    """No NaN or infinity (YAML's .nan, .inf), no integer beyond 64 bits: none is a meaningful
    setting, and each would fail later and far away (a deadline that never comes, an overflow in
    a socket option) instead of here, naming its key."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            _check_numbers(v, f"{path}.{k}" if path else str(k), sources, source)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            _check_numbers(v, f"{path}.{i}", sources, source)
    elif isinstance(tree, float) and not math.isfinite(tree):
        raise ConfigError(f"{sources.get(path, source)}: bad value for '{path}': {tree!r}: must be a finite number")
    elif isinstance(tree, int) and not isinstance(tree, bool) and not -(2**63) <= tree < 2**63:
        raise ConfigError(f"{sources.get(path, source)}: bad value for '{path}': {_show(tree)}: "
                          "does not fit in 64 bits")


def _check_semantics(cfg: Config, source: str) -> None:
    checks = [
        ("trainer.total_steps", cfg.trainer.total_steps >= 1, "must be at least 1"),
        ("trainer.sync_timeout_s", cfg.trainer.sync_timeout_s > 0, "must be positive"),
        ("rollout.n_workers", cfg.rollout.n_workers >= 1, "must be at least 1"),
        ("data.batch_size", cfg.data.batch_size >= 1, "must be at least 1"),
        ("data.max_prompt_length", cfg.data.max_prompt_length >= 1, "must be at least 1"),
        ("data.eval_prompts", cfg.data.eval_prompts >= 0, "must be 0 (no evaluation) or more"),
        ("trainer.eval_every", cfg.trainer.eval_every >= 0, "must be 0 (only the first and last) or more"),
        ("actor.micro_batch_size", cfg.actor.micro_batch_size >= 1, "must be at least 1"),
        ("actor.beta", 0.0 <= cfg.actor.beta <= 1.0, "must lie in [0, 1]"),
        ("actor.max_grad_norm", cfg.actor.max_grad_norm >= 0, "must be 0 (no clipping) or positive"),
        ("actor.temperature", cfg.actor.temperature > 0, "must be positive"),
        ("trainer.keep_checkpoints", cfg.trainer.keep_checkpoints >= 0, "must be 0 (keep all) or positive"),
        ("trainer.max_bad_steps", cfg.trainer.max_bad_steps >= 1, "must be at least 1"),
        ("trainer.checkpoint_every", cfg.trainer.checkpoint_every >= 1, "must be at least 1"),
        ("trainer.placement", set(cfg.trainer.placement) <= {"student", "rollout", "teacher"}
         and all(v > 0 for r in cfg.trainer.placement.values() for v in r.values()),
         "roles are student, rollout and teacher, each with positive amounts of Ray resources"),
        ("teacher.num_microbatches", cfg.teacher.num_microbatches >= 1, "must be at least 1"),
        ("teacher.request_timeout_s", cfg.teacher.request_timeout_s > 0, "must be positive"),
        ("telemetry.heartbeat_s", cfg.telemetry.heartbeat_s > 0, "must be positive"),
        ("telemetry.heartbeat_log_s", cfg.telemetry.heartbeat_log_s >= 0, "must be 0 (every heartbeat) or more"),
        ("telemetry.keyframe_mb", cfg.telemetry.keyframe_mb >= 0, "must be 0 (none) or more"),
        ("telemetry.pub_hwm", cfg.telemetry.pub_hwm >= 1, "must be at least 1"),
        ("rollout.gpu_memory_utilization", 0.0 < cfg.rollout.gpu_memory_utilization <= 1.0, "must lie in (0, 1]"),
    ]
    for key, ok, why in checks:
        if not ok:
            value = _get_path(msgspec.to_builtins(cfg), key.split("."))
            raise ConfigError(f"{source}: bad value for '{key}': {_show(value)}: {why}")
    for rule in cfg.shrink:
        if rule.key not in _valid_paths():
            raise ConfigError(f"{source}: shrink rule names unknown key '{rule.key}'{_nearest(rule.key)}")


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(msgspec.to_builtins(cfg), sort_keys=False)


def absolute_paths(cfg: Config, base: Path) -> Config:
    """Model folders and data files made absolute from ``base`` (where the run starts), so that the
    driver, its workers and a later restart all find them wherever they run."""
    def fix(p: str) -> str:
        return str((base / Path(p).expanduser()).resolve()) if p else p

    return msgspec.structs.replace(
        cfg, model=msgspec.structs.replace(cfg.model, path=fix(cfg.model.path)),
        teacher=msgspec.structs.replace(cfg.teacher, path=fix(cfg.teacher.path)),
        data=msgspec.structs.replace(cfg.data, files=[fix(f) for f in cfg.data.files],
                                     val_files=[fix(f) for f in cfg.data.val_files]))


def digest(cfg: Config) -> str:
    """A short, stable fingerprint of the resolved config (for `run` events and restarts)."""
    return hashlib.sha256(msgspec.json.encode(cfg)).hexdigest()[:12]


def shrink(cfg: Config) -> tuple[Config, list[tuple[str, Any, Any]]]:
    """Apply the `shrink` rules once: a smaller config and the (key, old, new) changes."""
    tree = msgspec.to_builtins(cfg)
    changes = []
    for rule in cfg.shrink:
        parts = rule.key.split(".")
        old = _get_path(tree, parts)
        if not isinstance(old, (int, float)) or isinstance(old, bool):
            continue
        new: int | float = max(rule.floor, old * rule.factor)
        if isinstance(old, int):
            new = max(int(rule.floor), int(old * rule.factor))
        else:
            new = round(new, 4)
        if new != old:
            _set_path(tree, rule.key, new, "shrink")
            changes.append((rule.key, old, new))
    return msgspec.convert(tree, Config), changes


def _section_paths(cls: type = Config, prefix: str = "") -> set[str]:
    out = set()
    for f in msgspec.structs.fields(cls):
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            out.add(prefix + f.name)
            out |= _section_paths(f.type, prefix + f.name + ".")
    return out


def diff(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """Flat (key, old, new) differences between two configs, in schema order; a mapping such as
    ``trainer.env`` by its entries."""
    a, b = msgspec.to_builtins(old), msgspec.to_builtins(new)
    sections = _section_paths()
    out = []
    for path in _valid_paths():
        if path in sections:
            continue
        parts = path.split(".")
        va, vb = _get_path(a, parts), _get_path(b, parts)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend((f"{path}.{k}", va.get(k), vb.get(k)) for k in sorted(set(va) | set(vb))
                       if va.get(k) != vb.get(k))
        else:
            out.append((path, va, vb))
    return out
