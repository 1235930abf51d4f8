"""A restart plan that follows the cause: config changes driven by the active findings, each saying
which finding it comes from.

- out of memory (the allocator's error, the kernel's OOM killer, a growth about to reach its limit): the
  memory ladder, in order (the first rungs that still change something);
- a straggler named by its peers, a dead or a frozen rollout worker: run without it (one rollout
  worker fewer), and on GPUs with a hung sync or group join, NCCL's own diagnostics and errors
  that raise instead of hang;
- nothing diagnosed: the config's own generic shrink rules.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from gkd_core import config as config_mod
from gkd_core import vocab
from gkd_core.state import AlertState, RunState
from gkd_core.telemetry.answers import ConfigChange

# the memory ladder of the troubleshooting guides as this trainer's keys: (key, factor, floor);
# gradient checkpointing and the offloads of the ladder have no key in the bundled trainer yet
LADDER = (("actor.micro_batch_size", 0.5, 1), ("rollout.gpu_memory_utilization", None, 0.5),
          ("rollout.max_new_tokens", 0.5, 8), ("data.batch_size", 0.5, 4))
LADDER_NOT_KEYS = "gradient checkpointing and offloading (set in your own job: no key here)"


def ladder_hint() -> str:
    """The ladder as the out-of-memory alert says it: the restart plan's rungs, in its order."""
    rungs = [f"{key} to {floor:g}" if factor is None else f"halve {key} (at least {floor:g})"
             for key, factor, floor in LADDER]
    return (f"the memory ladder, in order: {'; '.join(rungs)}; restart smaller (r) takes two rungs at a time; "
            f"then {LADDER_NOT_KEYS}")
# what the hang write-ups set first; NCCL_IB_DISABLE is left to the person (a large slowdown on
# InfiniBand clusters), named in the hint instead
NCCL_ENV = {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
# findings that single out a worker (not "slower than usual": everyone may be)
LATE = vocab.codes(late=True)


class Change(NamedTuple):
    key: str
    old: Any
    new: Any
    because: str  # the finding it follows from


def _get(cfg: config_mod.Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _rung(cfg: config_mod.Config, key: str, factor: float | None, floor: float) -> Any:
    old = _get(cfg, key)
    new = floor if factor is None else old * factor
    new = max(floor, int(new)) if isinstance(old, int) else round(max(floor, new), 4)
    return new if new < old else None


# out of memory, in the words of each finding: the allocator's error, the kernel's OOM killer, a growth
# that reaches its limit before the restart could
OUT_OF_MEMORY = {"out_of_memory": "out of memory on", "oom_killed": "killed by the OOM killer:",
                 "memory_growing": "memory growing toward its limit on"}


def _memory(cfg: config_mod.Config, finding: AlertState) -> list[Change]:
    because = f"{OUT_OF_MEMORY[finding.code]} {', '.join(finding.targets) or 'a worker'} (the memory ladder"
    out = []
    for i, (key, factor, floor) in enumerate(LADDER, 1):
        new = _rung(cfg, key, factor, floor)
        if new is not None:
            out.append(Change(key, _get(cfg, key), new, f"{because}, rung {i})"))
        if len(out) == 2:  # two rungs at a time: each restart one step further down, not all at once
            break
    return out


def _late(cfg: config_mod.Config, state: RunState, findings: list[AlertState]) -> list[Change]:
    rollouts = sorted({t for a in findings for t in a.targets if t.startswith("rollout/")})
    out = []
    if rollouts and len(rollouts) < cfg.rollout.n_workers:  # all of them named: the cause is elsewhere
        a = next(a for a in findings if set(a.targets) & set(rollouts))
        nodes = {state.workers[t].node for t in rollouts if t in state.workers}
        others = {w.node for w in state.workers.values() if w.role == "rollout" and w.src not in rollouts}
        place = (f" on {', '.join(sorted(nodes))}" if nodes - others and others else "")
        new = max(1, cfg.rollout.n_workers - len(rollouts))
        out.append(Change("rollout.n_workers", cfg.rollout.n_workers, new,
                          f"{a.code} {', '.join(rollouts)}{place}: run without it, one rollout worker fewer"
                          + (f" (or without node {', '.join(sorted(nodes))})" if place else "")))
    on_gpu = cfg.trainer.device == "cuda" or bool(state.gpus)
    sync = [a for a in findings if a.evidence.get("phase") in ("sync_weights", "join_group")
            or a.code == "sync_timed_out"]
    if sync and on_gpu:
        for k, v in NCCL_ENV.items():
            if cfg.trainer.env.get(k) != v:
                out.append(Change(f"trainer.env.{k}", cfg.trainer.env.get(k), v,
                                  f"{sync[0].code} in the weight sync: NCCL says where, and errors instead "
                                  "of hanging"))
    return out


def restart_plan(state: RunState, cfg: config_mod.Config) -> list[Change]:
    """The changes a smaller restart makes now, the most severe finding's first."""
    findings = state.active_alerts()
    # the allocator's word and the kernel's first; a growth only when it is critical (the limit is near)
    oom = [a for a in findings if a.code in ("out_of_memory", "oom_killed")] or \
        [a for a in findings if a.code == "memory_growing" and a.severity == "critical"]
    if oom:
        return _memory(cfg, oom[0])
    late = [a for a in findings if a.code in LATE]
    changes = _late(cfg, state, late) if late else []
    if changes:
        return changes
    _, generic = config_mod.shrink(cfg)
    return [Change(k, old, new, "nothing diagnosed: the config's shrink rules") for k, old, new in generic]


def apply(cfg: config_mod.Config, changes: list[Change]) -> config_mod.Config:
    # JSON is YAML: a string stays a string ("1" for an environment variable), a number a number
    return config_mod.apply_overrides(cfg, [f"{c.key}={json.dumps(c.new)}" for c in changes], source="restart plan")


def compose(cfg: config_mod.Config, state: RunState, shrink: bool = False,
            overrides: list[str] | tuple[str, ...] = ()) -> tuple[config_mod.Config, list[ConfigChange]]:
    """A restart's config: with ``shrink``, the plan that follows the active findings (nothing diagnosed:
    the config's shrink rules), then ``overrides``. Its changes, each ``(key, old, new, because)``, in the
    plan's order (the ladder's rungs in turn), then any other."""
    new = cfg
    because: dict[str, str] = {}
    if shrink:
        steps = restart_plan(state, new)
        new = apply(new, steps)
        because = {c.key: c.because for c in steps}
    if overrides:
        new = config_mod.apply_overrides(new, list(overrides), source="restart overrides")
        because.update({config_mod.parse_override(o)[0]: "asked for" for o in overrides})
    order = list(because)
    changes = sorted(((k, old, v, because.get(k, "")) for k, old, v in config_mod.diff(cfg, new)),
                     key=lambda c: order.index(c[0]) if c[0] in order else len(order))
    return new, changes
