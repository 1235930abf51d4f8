"""Checkpoints on disk: which are complete, which to delete, whether the next one fits.

A checkpoint is `RUN/checkpoints/step_NNNNNN/` and counts only once its `COMPLETE` file is there
(written last), so a save torn by a crash or a full disk is never the one a restart loads. Older
complete checkpoints are deleted only after a newer one is complete; torn ones older than the
newest complete one are deleted with them. Other folders (a copy set aside by hand) are left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

# room to spare beyond the last checkpoint's size: a save must not fill the disk to the last byte
FIT_MARGIN = 1.2


class FreeSpace(Protocol):
    def free_bytes(self, path: Path) -> int: ...


class DiskFreeSpace:
    """The real reading: what the file system says is free for this user (statvfs)."""

    def free_bytes(self, path: Path) -> int:
        return shutil.disk_usage(path).free


class FakeFreeSpace:
    """A fixed reading, for the `disk_full` fault and tests (no tmpfs needed)."""

    def __init__(self, free: int):
        self.free = free

    def free_bytes(self, path: Path) -> int:
        return self.free


def saved(root: Path) -> list[Path]:
    """The trainer's checkpoint folders under ``root`` (RUN/checkpoints), complete or not: ``step_`` and
    digits only, so that a copy set aside by hand (``step_000110.bak``) is neither loaded nor deleted."""
    return [p for p in root.glob("step_*") if p.name.removeprefix("step_").isdigit()]


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    return sorted(p for p in saved(root) if (p / "COMPLETE").exists())


def latest(root: Path) -> Path | None:
    done = complete(root)
    return done[-1] if done else None


def step_of(folder: Path) -> int:
    """The step a checkpoint holds, from its folder's name (``step_NNNNNN``)."""
    return int(folder.name.removeprefix("step_"))


def size_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (0: keep all), and torn ones older
    than the newest complete one. Returns what was deleted."""
    done = complete(root)
    if not done:
        return []
    gone = done[:-keep] if keep else []
    newest = done[-1].name
    gone += [p for p in saved(root) if p.is_dir() and p not in done and p.name < newest]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def fits(root: Path, need: int, disk: FreeSpace) -> tuple[bool, int]:
    """(whether a checkpoint of ``need`` bytes fits with margin, the free bytes read)."""
    free = disk.free_bytes(root)
    return free >= need * FIT_MARGIN, free
