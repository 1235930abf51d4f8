"""What is done with a config once loaded: written out, made absolute, digested, shrunk for a restart,
compared."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gkd_core.config.loading import get_path, set_path, valid_paths
from gkd_core.config.schema import Config


def to_yaml(cfg: Config) -> str:
    text: str = yaml.safe_dump(msgspec.to_builtins(cfg), sort_keys=False)
    return text


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
        old = get_path(tree, parts)
        if not isinstance(old, (int, float)) or isinstance(old, bool):
            continue
        new: int | float = max(rule.floor, old * rule.factor)
        if isinstance(old, int):
            new = max(int(rule.floor), int(old * rule.factor))
        else:
            new = round(new, 4)
        if new != old:
            set_path(tree, rule.key, new, "shrink")
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
    out: list[tuple[str, Any, Any]] = []
    for path in valid_paths():
        if path in sections:
            continue
        parts = path.split(".")
        va, vb = get_path(a, parts), get_path(b, parts)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend((f"{path}.{k}", va.get(k), vb.get(k)) for k in sorted(set(va) | set(vb))
                       if va.get(k) != vb.get(k))
        else:
            out.append((path, va, vb))
    return out
