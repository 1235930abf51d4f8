"""The collective group of the student and the rollout workers, through which the weights go: made
at a fresh rendezvous, torn down and made again after an aborted sync."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

import ray
from ray.actor import ActorHandle

from gkd_core.telemetry.reporter import Reporter

# the driver's guarded wait: (refs by member, timeout in s, phase, hint=...) -> their answers, or it raises
GuardedWait = Callable[..., dict]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SyncGroup:
    def __init__(self, members: Mapping[str, ActorHandle], *, backend: str, store_dir: Path | None,
                 student_ip: str, init_timeout_s: float, sync_timeout_s: float, wait: GuardedWait,
                 reporter: Reporter):
        """``members`` in rank order (the student is rank 0); ``store_dir``: where the members of a one-node
        group meet (a FileStore in the run's private socket folder), None across nodes, where they meet at
        ``student_ip``."""
        self.members, self.backend, self.store_dir, self.student_ip = dict(members), backend, store_dir, student_ip
        self.init_timeout_s, self.sync_timeout_s = init_timeout_s, sync_timeout_s
        self.wait, self.reporter = wait, reporter
        self.made = 0  # groups made so far: each gets its own rendezvous
        self.file: Path | None = None  # the current group's FileStore, removed with the group

    def make(self) -> None:
        """(Re)create the collective group at a fresh rendezvous."""
        rendezvous = self.rendezvous()
        refs = {m: actor.init_group.remote(rendezvous, len(self.members), rank, self.sync_timeout_s, self.backend)
                for rank, (m, actor) in enumerate(self.members.items())}
        with self.reporter.phase("join_group", timeout_s=self.init_timeout_s, detail=f"{self.backend} {rendezvous}"):
            self.wait(refs, self.init_timeout_s, "join_group",
                      hint="a member that never joins is stuck before init: dump its stack (d)")

    def rendezvous(self) -> str:
        """Where the group's members meet. On one node, a file in the run's private socket folder:
        torch's TCPStore listens on every interface, and anyone who reaches it could join or poison
        the group. Across nodes there is no shared private place, so rank 0 (the student) serves a
        TCPStore at its node's address, wherever it landed."""
        self.made += 1
        self.forget_file()
        if self.store_dir is not None:
            for stale in self.store_dir.glob("group-*.store") if self.made == 1 else ():
                stale.unlink(missing_ok=True)  # an earlier driver's, killed before it could remove it
            path = self.store_dir / f"group-{os.getpid()}-{self.made}.store"
            self.file = path
            return f"file://{path}"
        return f"tcp://{self.student_ip or ray.util.get_node_ip_address()}:{free_port()}"

    def forget_file(self) -> None:
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            self.file = None

    def rebuild(self) -> None:
        """An aborted sync leaves the group in an unknown state: tear it down and make a new one."""
        refs = {m: actor.destroy_group.remote() for m, actor in self.members.items()}
        self.wait(refs, self.sync_timeout_s, "destroy_group")
        self.make()
