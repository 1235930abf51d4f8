"""The run's driver, asked the same way whatever its kind (gkd_core/supervisor/drivers.py): what each kind
answers, and that nothing else in the supervisor asks which kind it has."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest

from gkd_core.state import RunState
from gkd_core.supervisor import drivers
from gkd_core.supervisor.control_ops import Asked, Refused
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Forwarded

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("Driver", "CommandDriver", "AdoptedDriver", "RayClusterDriver")


class FakeLife:
    """The driver's process as ``Reach`` sees it: handed ops are kept."""

    def __init__(self, alive: bool = True, connected: bool = True):
        self.is_alive, self.is_connected, self.handed = alive, connected, []

    def reach(self) -> drivers.Reach:
        def hand(args: ops.Handed, asked: Asked) -> Forwarded:
            self.handed.append((ops.OP_OF[type(args)], msgspec.to_builtins(args), asked.by))
            return Forwarded(to="driver pid 1")
        return drivers.Reach(hand=hand, alive=lambda: self.is_alive, connected=lambda: self.is_connected)


def state_with(*workers: str) -> RunState:
    st = RunState()
    for src in workers:
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], ts=1.0))
    return st


def test_the_kind_follows_what_the_run_was_given(tmp_path):
    reach = FakeLife().reach()
    assert type(drivers.driver_of(reach, tmp_path, "gkd_core.trainer.driver", None, None)) is drivers.Driver
    assert type(drivers.driver_of(reach, tmp_path, "", ["python", "job.py"], None)) is drivers.CommandDriver
    assert type(drivers.driver_of(reach, tmp_path, "", None, 4321)) is drivers.AdoptedDriver
    fields = [drivers.driver_of(reach, tmp_path, "m", c, a).endpoint_fields()
              for c, a in ((None, None), (["job"], None), (None, 4321))]
    assert fields == [{"driver_module": "m", "command": [], "adopted": 0, "ray_address": ""},
                      {"driver_module": "", "command": ["job"], "adopted": 0, "ray_address": ""},
                      {"driver_module": "", "command": [], "adopted": 4321, "ray_address": ""}]  # a takeover's
    cluster = drivers.driver_of(reach, tmp_path, "m", None, None, "10.0.0.1:6379")
    assert type(cluster) is drivers.RayClusterDriver and cluster.endpoint_fields()["ray_address"] == "10.0.0.1:6379"


def test_each_kind_says_whether_a_restart_may_change_it(tmp_path):
    reach, smaller = FakeLife().reach(), ops.RestartArgs(shrink=True)
    assert drivers.Driver(reach, "m").restart_refusal(smaller) == ""
    command = drivers.CommandDriver(reach, tmp_path, ["job"])
    assert "runs it again as it is" in command.restart_refusal(smaller)
    assert command.restart_refusal(ops.RestartArgs()) == ""  # run again as it is: allowed
    adopted = drivers.AdoptedDriver(reach, tmp_path, 7)
    assert "restart it as you started it" in adopted.restart_refusal(ops.RestartArgs())


def test_a_request_is_handed_to_the_jobs_driver_only_for_workers_the_run_has(tmp_path):
    life = FakeLife()
    ours = drivers.Driver(life.reach(), "m")
    st = state_with("rollout/0")
    ours.cancel(ops.CancelArgs(target="rollout/0"), Asked("cli"), st)
    assert life.handed == [("cancel", {"target": "rollout/0", "mode": "cooperative", "pid": 0}, "cli")]
    with pytest.raises(Refused, match="no worker 'rollout/9'"):
        ours.cancel(ops.CancelArgs(target="rollout/9"), Asked("cli"), st)
    assert ours.forward(ops.PauseArgs(for_s=5), Asked("cli"), st) == Forwarded(to="driver pid 1")
    assert life.handed[-1] == ("pause", {"for_s": 5.0}, "cli")


def test_a_commands_cancel_waits_for_its_driver_to_connect_and_its_stacks_are_taken_here(tmp_path):
    life = FakeLife(connected=False)
    command = drivers.CommandDriver(life.reach(), tmp_path, ["job"])
    with pytest.raises(Refused, match="has not called ray.init yet"):
        command.cancel(ops.CancelArgs(), Asked("cli"), state_with())
    assert command.can_take_stacks() and not drivers.Driver(life.reach(), "m").can_take_stacks()
    life.is_connected = True
    command.cancel(ops.CancelArgs(), Asked("cli"), state_with())
    assert life.handed[-1][0] == "cancel"


def test_nothing_in_the_supervisor_but_its_drivers_module_asks_which_kind_of_driver_a_run_has():
    """The kinds are named in drivers.py alone; no module of the supervisor branches on a run being a command,
    an adopted job or ours (a ``foreign`` flag, an ``adopt`` pid, an ``isinstance`` of a kind or a process)."""
    found = []
    for path in sorted((ROOT / "gkd_core" / "supervisor").glob("*.py")):
        if path.name == "drivers.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                kinds = ast.unparse(node.args[1])
                if any(k in kinds for k in (*KINDS, "Process")):
                    found.append(f"{path.name}:{node.lineno} isinstance(..., {kinds})")
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
            if name in (*KINDS[1:], "foreign", "local_stacks") or (
                    isinstance(node, ast.Attribute) and node.attr in ("adopt", "command")
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []


def test_a_clusters_driver_refuses_requests_in_its_jobs_and_judges_silence_by_its_looks(tmp_path):
    from gkd_core.config import load_config
    from gkd_core.node.ray_cluster import POLL_S

    cluster = drivers.RayClusterDriver(FakeLife().reach(), tmp_path, "auto")
    for args in (ops.CancelArgs(), ops.PauseArgs()):
        with pytest.raises(Refused, match="from outside"):
            cluster.forward(args, Asked("cli"), state_with())
    with pytest.raises(Refused, match="from outside"):
        cluster.cancel(ops.CancelArgs(), Asked("cli"), state_with())
    assert "nothing of it is its own to restart" in cluster.restart_refusal(ops.RestartArgs())
    # its actors' heartbeats come with each look: a silence is judged against the looks' period
    assert cluster.settings(load_config(None)).telemetry.heartbeat_s == POLL_S
    assert drivers.Driver(FakeLife().reach(), "m").settings(load_config(None)).telemetry.heartbeat_s == 1.0
