"""Each control op, declared once: the Struct of its arguments (with their defaults and what each must be),
its answer (a Struct of ``telemetry/answers``) and who carries it out.

The CLI and the dashboard build an op's Struct where the user acts and send it whole (``ControlClient.call``:
the op is the Struct's, ``OP_OF``), so that a wrong argument is a type error there; the supervisor (which
checks a request before an op sees it), our trainer's driver and a watched job's driver all read an op's
arguments back through ``parse``: a default (``cancel``'s target ``sync``, its mode ``cooperative``) is
written here and nowhere else.

Who carries an op out is its arguments' base: an ``Answered`` op is the supervisor's, whose reply is the
answer; a ``Handed`` op is handed on (to the job's driver, or to the supervisor's own stack taker), the reply
a receipt (``Forwarded``, ``Taking``) and the answer an ``action`` event carrying the request's id, which
whoever asked hears on the run's event stream (``RunState.outcome``). A new op is its arguments here, its
answer in ``telemetry/answers`` and one handler: the supervisor's (``Supervisor._ops``) or the drivers'
(``DriverCommands``).
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Generic, Literal

import msgspec
from msgspec import Meta

from gkd_core.errors import GkdError
from gkd_core.telemetry.answers import (
    A,
    Answer,
    Cancelled,
    Dumped,
    IngestOpened,
    Noted,
    Paused,
    Pong,
    Restarted,
    Resumed,
    Snapshot,
    Stopping,
)


class Args(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An op's arguments: an argument it does not take is refused (a typo, ``dry-run``, must never be taken
    for a real restart); a value is checked against its field's type and ``Meta``, whose description says
    what it must be."""


class Answered(Args, Generic[A]):
    """An op the supervisor carries out: its reply is the answer, ``A``."""


class Handed(Args, Generic[A]):
    """An op handed on (to the job's driver; a stacks dump of a job that is not ours, to the supervisor's own
    stack taker): its reply is a ``Receipt``, and the answer ``A`` an ``action`` event with the request's id."""


class QueryArgs(Answered[A], forbid_unknown_fields=False):
    """A query only reads (``ping``, ``snapshot``): what it is sent besides is ignored."""


class PingArgs(QueryArgs[Pong]):
    pass


class SnapshotArgs(QueryArgs[Snapshot]):
    pass


# an argument left out takes the receiver's own default (the run's grace, a dump id of the supervisor's);
# one sent must be a value (null is refused, as a typo would be)
Unset = msgspec.UnsetType
UNSET = msgspec.UNSET


class StopArgs(Answered[Stopping]):
    grace_s: Annotated[float, Meta(ge=0, le=86400, description="a number of seconds from 0 to 86400")] | Unset = UNSET


class RestartArgs(Answered[Restarted]):
    shrink: Annotated[bool, Meta(description="true or false")] = False
    dry_run: Annotated[bool, Meta(description="true or false")] = False
    overrides: Annotated[list[str], Meta(description="a list of key=value strings")] = []
    # how long the old driver has to stop before it is killed (the run's grace when left out)
    grace_s: Annotated[float, Meta(ge=0, le=86400, description="a number of seconds from 0 to 86400")] | Unset = UNSET


CancelMode = Literal["cooperative", "force"]


class CancelArgs(Handed[Cancelled]):
    target: Annotated[str, Meta(min_length=1, max_length=200,
                                description="a worker (rollout/1), 'sync' or 'all'")] = "sync"
    mode: Annotated[CancelMode, Meta(description="'cooperative' or 'force'")] = "cooperative"
    # a worker's process, when it must be that one: refused if the worker is another process by now (the recovery
    # stops a frozen worker whose driver may have started it again meanwhile: never the new one)
    pid: Annotated[int, Meta(ge=0, description="a process id (0: whichever process the worker is)")] = 0


DUMP_ID = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}\Z"  # a folder under RUN/stacks, nowhere else


class DumpStacksArgs(Handed[Dumped]):
    targets: Annotated[list[str], Meta(description="a list of workers, e.g. [\"rollout/1\"] ([] for all)")] = []
    dump_id: Annotated[str, Meta(pattern=DUMP_ID, description="a name of at most 64 letters, digits, '.', '_' "
                                                              "or '-'")] | Unset = UNSET


class Where(msgspec.Struct, array_like=True):
    """Where a worker the supervisor cannot read from its own node runs: its process and its Ray actor."""

    pid: int
    actor_id: str = ""


class RemoteStacksArgs(Handed[Dumped]):
    """The stacks of workers on other nodes, which a watched job's driver takes there for the supervisor (its
    ``dump_stacks`` of a job that is not ours: ``supervisor/local_stacks``): each worker's stack comes as a
    ``stack`` event of the dump, and the dump's end (the ``Dumped``) is the supervisor's to say, not the
    driver's. Only the supervisor asks it: a client's request of it is an unknown op."""

    dump_id: Annotated[str, Meta(pattern=DUMP_ID, description="a name of at most 64 letters, digits, '.', '_' "
                                                              "or '-'")]
    targets: Annotated[dict[str, Where], Meta(description="workers by name, each [pid, actor id]")] = {}


class PauseArgs(Handed[Paused]):
    # how long the driver stays paused unless resumed before: a pause that nobody ends must end (telemetry/pausing)
    for_s: Annotated[float, Meta(gt=0, le=7 * 86400, description="a number of seconds over 0, up to 604800 "
                                                                   "(a week)")] = 3600.0


class ResumeArgs(Handed[Resumed]):
    """The paused driver goes on (a pause asked for and not yet begun is called off)."""


class OpenIngestArgs(Answered[IngestOpened]):
    host: Annotated[str, Meta(description="an IP address, as text")] | Unset = UNSET


class NoteArgs(Answered[Noted]):
    text: Annotated[str, Meta(min_length=1, max_length=2000, description="1 to 2000 characters of text")]


OPS: dict[str, type[Args]] = {
    "ping": PingArgs, "snapshot": SnapshotArgs, "stop": StopArgs, "restart": RestartArgs, "cancel": CancelArgs,
    "dump_stacks": DumpStacksArgs, "remote_stacks": RemoteStacksArgs, "open_ingest": OpenIngestArgs,
    "note": NoteArgs, "pause": PauseArgs, "resume": ResumeArgs,
}
# the op an action's arguments are for: a caller sends the Struct (``ControlClient.call``), typed from the key or
# the command line to the handler, which parses them again
OP_OF: dict[type[Args], str] = {kind: op for op, kind in OPS.items()}
# Ops that only read: repeating one changes nothing, so the supervisor keeps no memory of their answers
# (a snapshot of a large run is megabytes). Every other op acts, and a repeat of it is answered from that
# memory.
QUERIES = frozenset(op for op, args in OPS.items() if issubclass(args, QueryArgs))


def answer_of(kind: type[Args]) -> type[Answer]:
    """The answer an op's arguments are declared with (``StopArgs(Answered[Stopping])``: ``Stopping``)."""
    for base in getattr(kind, "__orig_bases__", ()):
        if typing.get_origin(base) in (Answered, Handed, QueryArgs):
            return typing.cast(type[Answer], typing.get_args(base)[0])
    raise TypeError(f"{kind.__name__} declares no answer")


ANSWER_OF: dict[str, type[Answer]] = {op: answer_of(kind) for op, kind in OPS.items()}


# what an op may name besides the run's workers (the driver of a job that is not ours says nothing of
# itself until it calls ray.init: its stacks are still there to take)
NOT_WORKERS = {"cancel": ("sync", "all"), "dump_stacks": ("driver",)}

_UNKNOWN_FIELD = re.compile(r"unknown field `(.*)`", re.S)
_AT_FIELD = re.compile(r"at `\$\.([A-Za-z_]+)")
_MISSING = re.compile(r"missing required field `(.*)`")


class BadArgs(GkdError, ValueError):
    """The arguments are not what the op takes; the message names the op and the argument."""


def parse(op: str, args: dict) -> Args:
    """``args`` as ``op``'s Struct, defaults filled in; ``BadArgs`` naming the op and the argument (and what it
    must be) otherwise, ``KeyError`` for an op that is not declared."""
    kind = OPS[op]
    try:
        return msgspec.convert(args, kind)
    except msgspec.ValidationError as e:
        raise BadArgs(_say(op, kind, args, str(e))) from None


def _say(op: str, kind: type[Args], args: dict, error: str) -> str:
    fields = {f.name: f for f in msgspec.structs.fields(kind)}
    if m := _UNKNOWN_FIELD.search(error):
        return f"{op}: unknown argument {m.group(1)[:40]!r}; it takes {', '.join(fields) or 'none'}"
    if m := _MISSING.search(error):
        return f"{op}: argument {m.group(1)!r} is missing; it must be {_what(kind, m.group(1))}"
    if (m := _AT_FIELD.search(error)) and m.group(1) in fields:
        name = m.group(1)
        shown = msgspec.json.encode(args.get(name))[:60].decode(errors="replace")
        return f"{op}: argument {name!r} must be {_what(kind, name)}, got {shown}"
    return f"{op}: {error}"


def _what(kind: type[Args], name: str) -> str:
    """The field's description, from the ``Meta`` of its annotation (of an optional one's ``Annotated`` part)."""
    hint = typing.get_type_hints(kind, include_extras=True)[name]
    if typing.get_origin(hint) is not Annotated:
        hint = next((p for p in typing.get_args(hint) if typing.get_origin(p) is Annotated), hint)
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, Meta) and meta.description:
            return meta.description
    return f"a {hint}"
