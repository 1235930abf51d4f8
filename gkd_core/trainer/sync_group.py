"""The collective group of the student and the rollout workers, through which the weights go: made
at a fresh rendezvous, torn down and made again after an aborted sync."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from gkd_core.rundir import socket_dir

if TYPE_CHECKING:
    from gkd_core.trainer.cluster import Cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SyncGroup:
    def __init__(self, cluster: Cluster):
        self.c = cluster
        self.made = 0  # groups made so far: each gets its own rendezvous
        self.file: Path | None = None  # the current group's FileStore, removed with the group

    def make(self) -> None:
        """(Re)create the collective group at a fresh rendezvous."""
        members = self.c.members
        backend = "nccl" if self.c.device == "cuda" else "gloo"
        rendezvous = self.rendezvous()
        refs = {m: self.c.actors[m].init_group.remote(rendezvous, len(members), r, self.c.cfg.trainer.sync_timeout_s,
                                                    backend) for r, m in enumerate(members)}
        with self.c.rep.phase("join_group", timeout_s=self.c.cfg.trainer.init_timeout_s,
                              detail=f"{backend} {rendezvous}"):
            self.c.wait(refs, self.c.cfg.trainer.init_timeout_s, "join_group",
                      hint="a member that never joins is stuck before init: dump its stack (d)")

    def rendezvous(self) -> str:
        """Where the group's members meet. On one node, a file in the run's private socket folder:
        torch's TCPStore listens on every interface, and anyone who reaches it could join or poison
        the group. Across nodes there is no shared private place, so rank 0 (the student) serves a
        TCPStore at its node's address, wherever it landed."""
        self.made += 1
        self.forget_file()
        if not self.c.multi_node:
            folder = socket_dir(self.c.run_dir)
            for stale in folder.glob("group-*.store") if self.made == 1 else ():
                stale.unlink(missing_ok=True)  # an earlier driver's, killed before it could remove it
            path = folder / f"group-{os.getpid()}-{self.made}.store"
            self.file = path
            return f"file://{path}"
        address = self.c.info["student/0"].get("ip") or ray.util.get_node_ip_address()
        return f"tcp://{address}:{free_port()}"

    def forget_file(self) -> None:
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            self.file = None

    def rebuild(self) -> None:
        """An aborted sync leaves the group in an unknown state: tear it down and make a new one."""
        refs = {m: self.c.actors[m].destroy_group.remote() for m in self.c.members}
        self.c.wait(refs, self.c.cfg.trainer.sync_timeout_s, "destroy_group")
        self.make()
