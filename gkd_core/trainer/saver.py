"""Saving and resuming the student: a checkpoint only when it fits, the newest complete one loaded.

A checkpoint is the student as a Hugging Face folder (weights and tokenizer), its optimizer's
state and ``state.json`` (step, data position, sync id); see ``checkpoints`` for what makes one
complete and which are kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from gkd_core.config import Config
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer import checkpoints
from gkd_core.trainer.cluster import Cluster
from gkd_core.trainer.faults import FaultPlan
from gkd_core.units import size


class Saver:
    def __init__(self, cfg: Config, run_dir: Path, rep: Reporter, cluster: Cluster, faults: FaultPlan,
                 restart: int):
        self.cfg, self.run_dir, self.rep, self.cluster, self.faults = cfg, run_dir, rep, cluster, faults
        self.root = run_dir / "checkpoints"
        self.last_bytes = 0  # the last checkpoint's size (an estimate until this driver has saved one)
        self.disk_low = restart > 0  # a restarted driver clears what its predecessor raised, at its first save

    def latest(self) -> Path | None:
        return checkpoints.latest(self.root)

    def where(self, folder: Path | None) -> str:
        return str(folder.relative_to(self.run_dir)) if folder else "none yet"

    def resume(self) -> dict | None:
        """The newest complete checkpoint's state, loaded into the student; None for a fresh run."""
        ckpt = self.latest()
        student = self.cluster.actors["student/0"]
        timeout = self.cfg.trainer.init_timeout_s
        # what the next save will take, for the free-space check of the first one: the last
        # checkpoint's size, else the student's own estimate (weights and optimizer state)
        self.last_bytes = checkpoints.size_bytes(ckpt) if ckpt is not None else self.cluster.wait(
            {"student/0": student.checkpoint_bytes.remote()}, timeout, "resume")["student/0"]
        if ckpt is None:
            return None
        state = json.loads((ckpt / "state.json").read_text())
        self.cluster.wait({"student/0": student.load.remote(str(ckpt))}, timeout, "resume")
        return {**state, "folder": self.where(ckpt)}

    def save(self, step: int, state: dict) -> None:
        """Save, unless the last checkpoint's size does not fit on the disk: then a `disk_low` alert
        and training goes on without this save. Older checkpoints go once the new one is complete."""
        self.root.mkdir(parents=True, exist_ok=True)
        ok, free = checkpoints.fits(self.root, self.last_bytes, self.free_space(step))
        if not ok:
            self.disk_low = True
            last = self.latest()
            self.rep.emit(ev.AlertEvent(
                severity="critical", code="disk_low", targets=["checkpoint"],
                message=f"step {step} not saved: {size(free)} free on the run directory's disk, a "
                        f"checkpoint takes {size(self.last_bytes)}; training goes on"
                        + (f"; the last one is {self.where(last)}" if last else ""),
                hint="free space on that disk or lower trainer.keep_checkpoints; the next save tries again"))
            return
        folder = self.root / f"step_{step:06d}"
        with self.rep.phase("checkpoint", step=step):
            self.cluster.wait({"student/0": self.cluster.actors["student/0"].save.remote(str(folder))},
                              self.cfg.trainer.step_timeout_s, "checkpoint")
            (folder / "state.json").write_text(json.dumps({"step": step, **state}))
            (folder / "COMPLETE").write_text("")  # written last: a checkpoint without it is ignored
        self.last_bytes = checkpoints.size_bytes(folder)
        checkpoints.prune(self.root, self.cfg.trainer.keep_checkpoints)
        if self.disk_low:
            self.disk_low = False
            self.rep.emit(ev.AlertEvent(severity="critical", code="disk_low", targets=["checkpoint"], cleared=True))

    def free_space(self, step: int) -> checkpoints.FreeSpace:
        """The real reading, or the `disk_full` fault's empty disk."""
        return checkpoints.FakeFreeSpace(0) if self.faults.disk_full(step) else checkpoints.DiskFreeSpace()
