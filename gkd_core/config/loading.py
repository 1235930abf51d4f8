"""A config from YAML and overrides: every key checked, every bad value named with where it came from
and what to do."""

from __future__ import annotations

import difflib
import importlib.util
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gkd_core import vocab
from gkd_core.config.schema import Config
from gkd_core.errors import GkdError
from gkd_core.vocab import TRAINER_SYNC_PARTS

LOGGER_PACKAGES = ("tensorboard", "wandb")  # the loggers that need a package of their name (the loggers extra)


class ConfigError(GkdError, ValueError):
    """A config that must not start: says the key path, the value, the source and a fix."""


class ConfigWarning(UserWarning):
    """A config that starts, with a key that does nothing."""


# keys that once named the built-in models and were read by nothing: an older run's config.yaml
# still loads (``gkd-tui restart`` reads it), with a word that the key does nothing
RETIRED = {"model.name": "model.path says which student", "teacher.model": "teacher.path says which teacher"}


def valid_paths(cls: type = Config, prefix: str = "") -> list[str]:
    paths = []
    for f in msgspec.structs.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            paths.extend(valid_paths(f.type, path + "."))
    return paths


def _nearest(path: str) -> str:
    candidates = valid_paths()
    close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.5)
    if not close:  # compare the last component, which is what people usually mistype
        leaf = path.rsplit(".", 1)[-1]
        by_leaf = {p.rsplit(".", 1)[-1]: p for p in candidates}
        close = [by_leaf[m] for m in difflib.get_close_matches(leaf, by_leaf, n=1, cutoff=0.6)]
    return f"; did you mean '{close[0]}'?" if close else ""


class _YamlWithoutDates(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML: no types installed)
    """``yaml.safe_load`` without dates: no config value is one, and a date that is none (2001-02-30)
    raises ValueError from inside the parser, where no key can be named. Read as strings, they are
    refused by the type check, which names the key."""


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


def set_path(tree: dict[str, Any], key: str, value: Any, source: str) -> None:
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set '{key}': '{'.'.join(parts[: i + 1])}' is not a section")
        node = child
    node[parts[-1]] = value


def get_path(tree: Any, parts: list[str]) -> Any:
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
    tree: dict[str, Any] = {}
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


def _from_tree(tree: dict[str, Any], overrides: list[str] | tuple[str, ...], source: str) -> Config:
    sources: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        set_path(tree, key, value, f"override {_show(text)}")
        sources[key] = f"override {_show(text)}"
    _drop_retired(tree, sources, source)
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
        value = get_path(tree, where.split(".")) if where else None
        src = sources.get(where, source)
        reason = msg.split(" - at ")[0]
        if len(reason) > 200:  # msgspec quotes the value whole ("Invalid enum value '999…'"): cut, as _show cuts it
            reason = reason[:197] + "..."
        raise ConfigError(f"{src}: bad value for '{where or '(top level)'}': {_show(value)}: {reason}") from None
    _check_numbers(msgspec.to_builtins(cfg), "", sources, source)
    _check_semantics(cfg, source)
    return cfg


def _drop_retired(tree: dict[str, Any], sources: dict[str, str], source: str) -> None:
    for key, instead in RETIRED.items():
        section, _, name = key.partition(".")
        part = tree.get(section)
        if isinstance(part, dict) and name in part:
            value = part.pop(name)
            warnings.warn(f"{sources.get(key, source)}: '{key}' ({_show(value)}) is read by nothing and ignored "
                          f"({instead}): remove it", ConfigWarning, stacklevel=4)


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


def missing_packages(loggers: Sequence[str]) -> list[str]:
    """The packages ``trainer.logger``'s loggers need that this Python does not have (trainer/loggers.py)."""
    return [name for name in loggers if name in LOGGER_PACKAGES and importlib.util.find_spec(name) is None]


def unknown_codes(codes: list[str]) -> str:
    """What is wrong with ``codes`` as alerts' codes (``recovery.restart_on``, ``--restart-on``), or ""."""
    for code in codes:
        if code not in vocab.ALERTS:
            near = difflib.get_close_matches(code, vocab.ALERTS, n=1)
            return (f"{code!r} is not an alert's code" + (f" (did you mean {near[0]}?)" if near else "")
                    + f"; the codes are {', '.join(vocab.ALERTS)}")
    return ""


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
        ("recovery.restart_on", not (unknown := unknown_codes(cfg.recovery.restart_on)), unknown),
        ("trainer.logger", not (missing := missing_packages(cfg.trainer.logger)),
         f"needs {', '.join(missing)}, not installed here: pip install 'gkd-tui[loggers]'"),
        ("recovery.grace_s", cfg.recovery.grace_s >= 0, "must be 0 (at once) or more"),
        ("recovery.per_hour", cfg.recovery.per_hour >= 1, "must be at least 1"),
        ("recovery.backoff_s", cfg.recovery.backoff_s >= 0, "must be 0 or more"),
    ]
    for key, ok, why in checks:
        if not ok:
            value = get_path(msgspec.to_builtins(cfg), key.split("."))
            raise ConfigError(f"{source}: bad value for '{key}': {_show(value)}: {why}")
    for i, f in enumerate(cfg.faults):
        if f.kind == "slow_sync_part" and not f.part:
            raise ConfigError(f"{source}: bad value for 'faults[{i}]': a slow_sync_part fault needs its part: one of "
                              f"{', '.join(TRAINER_SYNC_PARTS)}")
    for rule in cfg.shrink:
        if rule.key not in valid_paths():
            raise ConfigError(f"{source}: shrink rule names unknown key '{rule.key}'{_nearest(rule.key)}")
