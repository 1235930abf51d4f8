"""A request is typed from where the user acts to the handler: its arguments are the op's Struct
(``telemetry/ops``), built at the key or the command line and sent whole (``ControlClient.call``: the op is the
Struct's), then parsed into the same Struct for the handler, and its answer is the Struct the op declares. A
wrong argument's type is a type error, found before anything is sent, and so is a wrong read of the answer."""

from __future__ import annotations

from pathlib import Path

import msgspec
import mypy.api

from gkd_core.telemetry import ops

ROOT = Path(__file__).resolve().parents[2]


def type_errors(program: str, folder: Path) -> str:
    """What mypy, with the repository's settings, says of ``program``."""
    path = folder / "program.py"
    path.write_text("from gkd_core.telemetry import ops\n" + program)
    out, err, _ = mypy.api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
                                "--hide-error-context", str(path)])
    return out + err


def test_an_argument_of_the_wrong_type_fails_type_checking_and_a_right_one_passes(tmp_path):
    assert type_errors("ops.RestartArgs(shrink=True, overrides=['trainer.lr=1e-5'], grace_s=3.0)\n", tmp_path) == ""
    wrong = type_errors('ops.RestartArgs(shrink="yes")\n', tmp_path)
    assert 'Argument "shrink" to "RestartArgs" has incompatible type "str"; expected "bool"' in wrong, wrong
    assert "error" in type_errors("ops.CancelArgs(mode='gently')\n", tmp_path)  # (a Literal: cooperative or force)
    # the op added last, as an example of adding one (pause/resume): its argument typed the same way
    assert type_errors("ops.PauseArgs(for_s=60.0)\nops.ResumeArgs()\n", tmp_path) == ""
    wrong = type_errors('ops.PauseArgs(for_s="1h")\n', tmp_path)
    assert 'Argument "for_s" to "PauseArgs" has incompatible type "str"' in wrong, wrong


def test_every_action_op_has_its_own_struct_and_a_struct_says_its_op():
    assert set(ops.OP_OF.values()) == set(ops.OPS)
    assert {ops.OP_OF[type(a)] for a in (ops.RestartArgs(shrink=True), ops.StopArgs(), ops.CancelArgs(),
                                         ops.DumpStacksArgs(), ops.NoteArgs(text="x"), ops.PauseArgs(),
                                         ops.ResumeArgs())} == {
        "restart", "stop", "cancel", "dump_stacks", "note", "pause", "resume"}
    # what goes on the wire is what the handler parses back: the Struct again, an argument left out unset
    sent = ops.RestartArgs(shrink=True)
    assert ops.parse("restart", msgspec.to_builtins(sent)) == sent
    assert msgspec.to_builtins(ops.StopArgs()) == {}


def test_an_answer_is_typed_as_its_op_declares_it(tmp_path):
    """``call(RestartArgs(...))`` is a ``Restarted``: reading a field it does not have fails type checking, and an
    op the driver carries out is not ``call``ed (its reply is a receipt: ``hand``)."""
    client = "from gkd_core.telemetry.control import ControlClient\nc = ControlClient('ipc:///x')\n"
    assert type_errors(client + "n: int = c.call(ops.RestartArgs(shrink=True, dry_run=True)).restart\n"
                       "said: str = c.hand(ops.CancelArgs()).said()\n", tmp_path) == ""
    wrong = type_errors(client + "c.call(ops.RestartArgs(dry_run=True)).changed\n", tmp_path)
    assert '"Restarted" has no attribute "changed"' in wrong, wrong
    wrong = type_errors(client + "c.call(ops.CancelArgs())\n", tmp_path)
    assert 'incompatible type "CancelArgs"' in wrong, wrong
    assert {op: ops.ANSWER_OF[op].__name__ for op in ("restart", "cancel", "pause", "ping")} == {
        "restart": "Restarted", "cancel": "Cancelled", "pause": "Paused", "ping": "Pong"}
