"""The supervisor: owns RUN/, the event log, the RunState and the driver process.

One thread, one ``zmq.Poller`` loop with a 100 ms tick. It reads worker events from the PULL
socket, stamps ``seq`` and ``run``, appends them to ``events.jsonl``, publishes them on PUB and
folds them into its RunState; it answers control requests itself, so every op is answered
within a bounded time even when the driver is hung; it watches the driver without blocking and
turns its exit into a `run` event.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from gkd_core import config as config_mod
from gkd_core import diagnosis, rundir
from gkd_core.diagnosis import plan, stragglers
from gkd_core.integrations import job_env
from gkd_core.state import RunState, encode_state
from gkd_core.supervisor import alerts, eventlog
from gkd_core.supervisor.driver_process import AdoptedProcess, DriverProcess, describe_exit
from gkd_core.supervisor.eventlog import EventLog
from gkd_core.supervisor.heartbeat_log import HeartbeatLog
from gkd_core.supervisor.keyframes import KeyframeWriter
from gkd_core.supervisor.local_stacks import LocalStacks
from gkd_core.telemetry import control, events as ev, ingest

log = logging.getLogger("gkd.supervisor")

TICK_S = 0.1
FLUSH_EVERY_S = 0.05  # chores (flush, driver watch) at most this often; the crash-loss bound
ALERT_EVERY_S = 0.5
ALERT_SHARE_INV = 5  # the alerts' pass takes at most a fifth of the supervisor's time
INGEST_BATCH = 5000
BEATS_PER_LINE = 4096  # beats kept from batches are written at least this many to a line
AUTH_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                 | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
DEFAULT_DRIVER = "gkd_core.trainer.driver"
_NOBLOCK, _RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
# exit status of `python -m gkd_core run` for a run that was stopped on request (as SIGTERM's)
STOPPED_EXIT = 143


class Refused(Exception):
    """A control request that is understood but cannot be carried out; the message says why."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# The arguments each op that acts takes, and what each must be. Anything else is refused before
# anything is done, naming the op and the argument: a typo (`dry-run`) must not be taken for a real
# restart, nor a string for a number deep in the loop, where it would take the supervisor down.
# (ping and snapshot only read, and ignore their arguments.)
_DUMP_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")  # a folder under RUN/stacks, nowhere else
OP_ARGS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "stop": {"grace_s": (lambda v: _number(v) and 0 <= v <= 86400, "a number of seconds from 0 to 86400")},
    "restart": {"shrink": (lambda v: isinstance(v, bool), "true or false"),
                "dry_run": (lambda v: isinstance(v, bool), "true or false"),
                "overrides": (_strings, "a list of key=value strings")},
    "cancel": {"target": (lambda v: isinstance(v, str) and 0 < len(v) <= 200, "a worker (rollout/1), 'sync' or 'all'"),
               "mode": (lambda v: v in ("cooperative", "force"), "'cooperative' or 'force'")},
    "dump_stacks": {"targets": (_strings, "a list of workers, e.g. [\"rollout/1\"] ([] for all)"),
                    "dump_id": (lambda v: isinstance(v, str) and _DUMP_ID.fullmatch(v) is not None,
                                "a name of at most 64 letters, digits, '.', '_' or '-'")},
    "open_ingest": {"host": (lambda v: isinstance(v, str), "an IP address, as text")},
}


def check_args(op: str, args: dict) -> None:
    """Refused, naming the op and the argument, unless ``args`` are what ``op`` takes."""
    wanted = OP_ARGS.get(op)
    if wanted is None:
        return
    for name, value in args.items():
        if name not in wanted:
            takes = ", ".join(wanted) if wanted else "none"
            raise Refused(f"{op}: unknown argument {name[:40]!r}; it takes {takes}")
        ok, what = wanted[name]
        if not ok(value):
            shown = msgspec.json.encode(value)[:60].decode(errors="replace")
            raise Refused(f"{op}: argument {name!r} must be {what}, got {shown}")


def _ipc(path: Path) -> str:
    return f"ipc://{path}"


SOCKETS = ("events.sock", "control.sock", "driver.sock", "ingest.sock")  # in the run's private socket folder


class Supervisor:
    def __init__(self, cfg: config_mod.Config, *, config_source: str = "the embedded default",
                 home: Path | None = None, run_id: str | None = None, driver_module: str = DEFAULT_DRIVER,
                 linger_s: float = 0.0, grace_s: float = 10.0, resume: Path | None = None,
                 command: list[str] | None = None, adopt: int | None = None):
        """``resume``: the directory of a run whose supervisor is gone (``gkd-tui restart``): its log
        is taken over and its driver started again, which resumes from the latest checkpoint.
        ``command``: any command as the run's driver (``launch -- COMMAND``), its processes watched
        through the run's environment (gkd_core/integrations). ``adopt``: the pid of a job its user started,
        which asked for a run of its own (``GKD_WATCH=1``, gkd_core/integrations/opt_in.py)."""
        self.cfg = cfg = config_mod.absolute_paths(cfg, Path.cwd())
        self.config_source = config_source
        self.driver_module = driver_module
        self.command = list(command) if command else None
        self.adopt = adopt
        self.foreign = bool(self.command or adopt)  # a job that is not our trainer: its stacks are taken here
        self.linger_s = linger_s
        self.grace_s = grace_s
        os.umask(0o077)  # everything this process creates (sockets, logs, keys) is private
        self.resuming, self.resumed_from_pid = resume is not None, 0
        self.run_dir = resume if resume is not None else rundir.create_run_dir(home, run_id)
        self.run_id = self.run_dir.name
        self.local_stacks = LocalStacks(self.run_dir, self._forward_stacks) if self.foreign else None
        self.state = RunState()
        self.seq = 0
        self.rejects = ev.RejectCounter()
        self._rejects_reported = 0
        self._auth_refused = 0
        self._auth_reported = 0
        self.restarts = 0
        self.driver: DriverProcess | None = None
        self.driver_identity: bytes | None = None
        self._pending_config: Path | None = None
        self._stopping = False
        self._ended_at: float | None = None
        self._exit_status = 0
        self._signalled = False
        self._next_alerts = 0.0
        self.auto_stacks = diagnosis.AutoStacks()
        self._started_mono = time.monotonic()
        self.ctx = zmq.Context()
        self._authenticator = None
        self._monitors: list[zmq.Socket] = []
        self._ops: dict[str, Callable[[dict, str], Any]] = {
            "ping": self._op_ping, "snapshot": self._op_snapshot, "stop": self._op_stop,
            "restart": self._op_restart, "cancel": self._op_cancel_foreign if self.foreign else self._forward("cancel"),
            "dump_stacks": self._op_dump_local if self.foreign else self._forward("dump_stacks"),
            "open_ingest": self._op_open_ingest,
        }
        self.ingest_tcp: zmq.Socket | None = None  # for other nodes, opened by the driver (ingest.py)
        self._ingest_monitor: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self.heartbeats = HeartbeatLog(cfg.telemetry.heartbeat_log_s, cfg.telemetry.heartbeat_s)
        self._beats_kept: list = []  # beats of batches the log keeps, not yet written (`_take_batch`)
        self._beats_seq = 0
        if resume is not None:
            self._take_over()
        else:
            (self.run_dir / "config.yaml").write_text(config_mod.to_yaml(cfg))
        self.log = EventLog(self.run_dir / "events.jsonl", max_ts=self.state.last_ts)
        self.keyframes = KeyframeWriter(self.run_dir / "keyframes", cfg.telemetry.keyframe_mb)
        self.config_path = self.run_dir / "restarts" / f"{self.restarts:03d}.yaml"
        self.config_path.write_text(config_mod.to_yaml(cfg))
        self._bind()

    def _take_over(self) -> None:
        """A run whose supervisor is gone: its state and ``seq`` from its log (a torn last line cut
        off), and the next restart's number."""
        self.resumed_from_pid = rundir.supervisor_pid(self.run_dir)
        for line in eventlog.recover(self.run_dir / "events.jsonl"):
            try:
                _, typed = ev.decode_dict(line)
            except ev.Rejected:
                continue  # a line that is no event: the log keeps it, the state cannot use it
            self.state.apply(typed)
            self.seq = max(self.seq, getattr(typed, "seq", 0) or 0)
        made = [int(f.stem) for f in (self.run_dir / "restarts").glob("*.yaml") if f.stem.isdigit()]
        self.restarts = max([self.state.restarts, *made]) + 1

    # --- sockets -------------------------------------------------------------------------

    def _bind(self) -> None:
        tel = self.cfg.telemetry
        sockdir = rundir.socket_dir(self.run_dir)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.sndhwm = tel.pub_hwm
        self.pub.linger = 500
        self.pub.bind(_ipc(sockdir / "events.sock"))
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.linger = 0
        self.control.bind(_ipc(sockdir / "control.sock"))
        self.drivers = self.ctx.socket(zmq.ROUTER)
        self.drivers.linger = 0
        self.drivers.bind(_ipc(sockdir / "driver.sock"))
        self.ingest = self._pull()
        self.ingest.bind(_ipc(sockdir / "ingest.sock"))
        for name in SOCKETS:
            os.chmod(sockdir / name, 0o600)
        endpoints = {
            "run_id": self.run_id,
            "events": self.pub.last_endpoint.decode(),
            "control": self.control.last_endpoint.decode(),
            "ingest": self.ingest.last_endpoint.decode(),
            "driver": self.drivers.last_endpoint.decode(),
            "supervisor_pid": os.getpid(),
            "host": socket.gethostname(),  # where that pid lives
            "driver_module": self.driver_module,  # what a supervisor that takes the run over starts
            "command": self.command or [],  # ... or this command (launch -- COMMAND)
            "adopted": self.adopt or 0,  # ... or nothing: a job its user started, which only its user can start
            "ray_address": "",
        }
        self.control_tcp = self.events_tcp = None
        if tel.control_tcp or tel.events_tcp:
            self._bind_tcp(endpoints)
        self.endpoints = endpoints  # published in endpoints.json once the run's first events are logged

    def _pull(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PULL)
        sock.rcvhwm = 100_000
        sock.linger = 0
        return sock

    def _zap(self):
        """The CurveZMQ authenticator (a thread), started the first time a tcp socket needs it."""
        if self._authenticator is None:
            from zmq.auth.thread import ThreadAuthenticator

            self._authenticator = ThreadAuthenticator(self.ctx, log=logging.getLogger("gkd.zap"))
            self._authenticator.start()
        return self._authenticator

    def _bind_tcp(self, endpoints: dict) -> None:
        """Optional tcp endpoints, authenticated with CurveZMQ; refusals are recorded."""
        tel = self.cfg.telemetry
        keys = self.run_dir / "keys"
        control.create_keys(keys)
        self._zap().configure_curve(domain="*", location=str(keys / "authorized"))
        if tel.control_tcp:
            self.control_tcp = self.ctx.socket(zmq.ROUTER)
            self.control_tcp.linger = 0
            control.server_curve(self.control_tcp, keys)
            self._monitors.append(self.control_tcp.get_monitor_socket(AUTH_FAILURES))
            self.control_tcp.bind(f"tcp://{tel.control_tcp}")
            endpoints["control_tcp"] = self.control_tcp.last_endpoint.decode()
        if tel.events_tcp:
            self.events_tcp = self.ctx.socket(zmq.PUB)
            self.events_tcp.sndhwm = tel.pub_hwm
            self.events_tcp.linger = 0
            control.server_curve(self.events_tcp, keys)
            self._monitors.append(self.events_tcp.get_monitor_socket(AUTH_FAILURES))
            self.events_tcp.bind(f"tcp://{tel.events_tcp}")
            endpoints["events_tcp"] = self.events_tcp.last_endpoint.decode()

    # --- events --------------------------------------------------------------------------

    def _commit(self, obj: dict, typed: ev.Event | ev.UnknownEvent, kind: bytes, logged: bool = True) -> None:
        self.seq += 1
        obj["seq"] = self.seq
        obj["run"] = self.run_id
        ts = obj.get("ts") or time.time()
        obj["ts"] = ts
        typed.seq, typed.ts = self.seq, ts
        if isinstance(typed, ev.Event):
            typed.run = self.run_id
        line = ev.encode_dict(obj)
        if logged:
            self._log(line, ts)
        self._publish(kind, line)
        self.state.apply(typed)

    def _log(self, line: bytes, ts: float) -> None:
        if self._beats_kept:
            self._write_beats()  # the log stays in seq order
        self.log.append(line, ts)

    def _publish(self, kind: bytes, line: bytes) -> None:
        try:
            self.pub.send(kind, _NOBLOCK_MORE)
            self.pub.send(line, _NOBLOCK)
            if self.events_tcp is not None:
                self.events_tcp.send(kind, _NOBLOCK_MORE)
                self.events_tcp.send(line, _NOBLOCK)
        except zmq.Again:
            pass  # PUB drops for slow subscribers by itself; they see the gap and resnapshot

    def _take_batch(self, e: ev.HeartbeatsEvent) -> None:
        """A node's heartbeats in one message: stamped, published and applied whole, as one event; the
        log keeps the beats the single form would keep (``heartbeat_log``), gathered across batches
        into one ``heartbeats`` line of the supervisor's, written before the next line of any other
        kind (or at the next flush), under the seq of the newest batch it holds."""
        self.seq += 1
        e.seq, e.run = self.seq, self.run_id
        if not e.ts:
            e.ts = time.time()
        self._publish(b"heartbeats", ev.encode(e))
        admit, kept = self.heartbeats.admit, self._beats_kept
        n = len(kept)
        for b in e.beats:
            logged, before = admit(b)
            if before is not None:
                kept.append(before)
            if logged:
                kept.append(b)
        if len(kept) > n:
            self._beats_seq = self.seq  # the line's seq: the newest batch it holds beats of
            if len(kept) >= BEATS_PER_LINE:
                self._write_beats()
        self.state.apply(e)

    def _write_beats(self) -> None:
        beats = [b if type(b) is ev.Beat else ev.Beat(b.src, b.ts, b.phase, b.elapsed, b.rss, b.cpu, b.dropped)
                 for b in self._beats_kept]
        self._beats_kept = []
        ts = max(b.ts for b in beats)
        self.log.append(ev.encode(ev.HeartbeatsEvent(seq=self._beats_seq, run=self.run_id, src="supervisor",
                                                     ts=ts, beats=beats)), ts)

    def emit(self, event: ev.Event) -> None:
        """An event of the supervisor's own (src defaults to ``supervisor``)."""
        event.src = event.src or "supervisor"
        event.ts = event.ts or time.time()
        obj = msgspec.to_builtins(event)
        obj["kind"] = event.__struct_config__.tag
        self._commit(obj, event, obj["kind"].encode())

    def _drain_ingest(self, sock: zmq.Socket | None = None) -> None:
        # the hot path: plain recv with int flags (pyzmq's recv_multipart and enum flags cost
        # more than decoding the event); a message is [json] or [kind, json]
        sock = sock or self.ingest
        recv, more = sock.recv, sock.getsockopt
        for _ in range(INGEST_BATCH):
            try:
                data = recv(_NOBLOCK)
            except zmq.Again:
                return
            n, first = 1, data
            while more(_RCVMORE):
                data = recv(_NOBLOCK)
                n += 1
            if n == 2 and first == b"heartbeats":  # a relay's batch: the fast path
                batch = ev.decode_batch(data)
                if batch is not None:
                    self._take_batch(batch)
                    continue
            try:
                if n > 2:
                    raise ev.Rejected("malformed", f"{n} frames; an event is [json] or [kind, json]")
                obj, typed = ev.decode_dict(data)
            except ev.Rejected as r:
                self.rejects.add(r, "ingest ")
                continue
            if type(typed) is ev.HeartbeatsEvent:
                self._take_batch(typed)
            elif type(typed) is ev.HeartbeatEvent:
                logged, before = self.heartbeats.admit(typed)
                if before is not None:
                    self.emit(before if type(before) is ev.HeartbeatEvent else ev.heartbeat_of(before))
                self._commit(obj, typed, b"heartbeat", logged)
            else:
                self._commit(obj, typed, obj["kind"].encode())

    def _restate_silent(self, everyone: bool = False) -> None:
        """Log the newest heartbeat of each worker that fell silent since (see heartbeat_log)."""
        for e in self.heartbeats.held() if everyone else self.heartbeats.silent():
            self.emit(e if type(e) is ev.HeartbeatEvent else ev.heartbeat_of(e))  # (a batch's beat)

    # --- control -------------------------------------------------------------------------

    def _serve_control(self, sock: zmq.Socket, via: str) -> None:
        for _ in range(100):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident, envelope, body = frames[0], frames[1:-1], frames[-1]
            if len(frames) < 2:
                continue
            try:
                req = control.decode_request(body)
            except ValueError as e:
                sock.send_multipart([ident, *envelope, control.encode_reply(False, error=str(e))])
                self.emit(ev.ActionEvent(op="invalid", by=via, ok=False, result=str(e)[:300]))
                continue
            by = f"{req.by[:80] or 'anonymous'} via {via}"
            handler = self._ops.get(req.op)
            if handler is None:
                err = f"unknown op {req.op[:40]!r}; this supervisor answers {', '.join(self._ops)}"
                sock.send_multipart([ident, *envelope, control.encode_reply(False, error=err, req_id=req.id)])
                self.emit(ev.ActionEvent(op=req.op[:40], by=by, ok=False, result=err))
                continue
            try:
                check_args(req.op, req.args)
                result = handler(req.args, by)
            except (Refused, config_mod.ConfigError) as e:
                sock.send_multipart([ident, *envelope, control.encode_reply(False, error=str(e), req_id=req.id)])
                self.emit(ev.ActionEvent(op=req.op, by=by, ok=False, result=str(e)[:500]))
                continue
            except Exception as e:  # a bug of ours: refused and on the record, never the supervisor's death
                log.exception("control op %s", req.op)
                err = f"{req.op}: internal error, {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                sock.send_multipart([ident, *envelope, control.encode_reply(False, error=err, req_id=req.id)])
                self.emit(ev.ActionEvent(op=req.op, by=by, ok=False, result=err))
                continue
            if isinstance(result, msgspec.Raw):
                reply = b'{"ok":true,"error":"","id":%d,"result":%s}' % (req.id, bytes(result))
            else:
                reply = control.encode_reply(True, result, req_id=req.id)
            sock.send_multipart([ident, *envelope, reply])
            if req.op not in ("ping", "snapshot"):  # queries are not actions; everything else is recorded
                self.emit(ev.ActionEvent(op=req.op, by=by, ok=True, result=result))

    def _op_ping(self, args: dict, by: str) -> dict:
        return {"pong": True, "run": self.run_id, "seq": self.seq, "state": self.state.state,
                "pid": os.getpid(), "uptime_s": round(time.monotonic() - self._started_mono, 3)}

    def _op_snapshot(self, args: dict, by: str) -> msgspec.Raw:
        meta = msgspec.json.encode({
            "pid": os.getpid(), "run_dir": str(self.run_dir), "events_logged": self.log.lines,
            "rejected": dict(self.rejects.counts), "rejected_recent": list(self.rejects.recent),
            "driver_pid": self.driver.pid if self.driver else None,
            "driver_connected": self.driver_identity is not None,
        })
        return msgspec.Raw(b'{"seq":%d,"supervisor":%s,"state":%s}' % (self.seq, meta, encode_state(self.state)))

    def _op_stop(self, args: dict, by: str) -> dict:
        self.request_stop(args.get("grace_s", self.grace_s))
        return {"stopping": True, "driver_pid": self.driver.pid if self.driver else None}

    def _op_restart(self, args: dict, by: str) -> dict:
        if self._stopping:
            raise Refused("the run is stopping; a restart would be undone at once")
        if self._pending_config is not None:
            raise Refused("a restart is already under way")
        if self.adopt:
            raise Refused(f"this run watches a job it did not start (pid {self.adopt}): restart it as you started it")
        if self.command and (args.get("shrink") or args.get("overrides")):
            raise Refused("this run's driver is a command of its own (launch -- COMMAND): a restart runs it again "
                          "as it is; to change its settings, stop it and launch it with them")
        new = self.cfg
        because: dict[str, str] = {}
        if args.get("shrink"):  # the plan follows the active findings; nothing diagnosed: the shrink rules
            steps = plan.restart_plan(self.state, new)
            new = plan.apply(new, steps)
            because = {c.key: c.because for c in steps}
        overrides = args.get("overrides", [])
        if overrides:
            new = config_mod.apply_overrides(new, overrides, source="restart overrides")
            because.update({config_mod.parse_override(o)[0]: "asked for" for o in overrides})
        order = list(because)  # the plan's order (the ladder's rungs in turn), then anything else
        changes = sorted(([k, old, v, because.get(k, "")] for k, old, v in config_mod.diff(self.cfg, new)),
                         key=lambda c: order.index(c[0]) if c[0] in order else len(order))
        result = {"restart": self.restarts + 1, "changes": changes, "digest": config_mod.digest(new)}
        if args.get("dry_run"):
            return result
        path = self.run_dir / "restarts" / f"{self.restarts + 1:03d}.yaml"
        path.write_text(config_mod.to_yaml(new))  # written before it is used
        (self.run_dir / "config.yaml").write_text(config_mod.to_yaml(new))
        self.cfg = new
        self._pending_config = path
        result["config"] = str(path.relative_to(self.run_dir))
        self.emit(ev.RunEvent(state="restarting", restart=self.restarts, config_digest=config_mod.digest(new),
                              reason=f"restart requested by {by}" + (" (smaller)" if args.get("shrink") else "")))
        if self.driver is not None and self.driver.poll() is None:
            self.driver.terminate(self.grace_s)
        return result

    def _forward(self, op: str) -> Callable[[dict, str], dict]:
        def forward(args: dict, by: str) -> dict:
            if self.driver is None or self.driver.poll() is not None:
                raise Refused(f"'{op}' needs a running driver; the run is {self.state.state or 'not started'}")
            if self.driver_identity is None:
                raise Refused(f"'{op}': the driver (pid {self.driver.pid}) has not connected its command channel; "
                              "it may be hung before init: try `gkd-tui dump-stacks driver`")
            cmd = {"op": op, "args": args, "by": by, "id": self.seq}
            self.drivers.send_multipart([self.driver_identity, msgspec.json.encode(cmd)], zmq.NOBLOCK)
            return {"forwarded": True, "to": f"driver pid {self.driver.pid}"}
        return forward

    def _op_cancel_foreign(self, args: dict, by: str) -> dict:
        """A job of its own: its driver cancels (gkd_core/integrations/cancels.py) once it has called ray.init."""
        if self.driver is not None and self.driver.poll() is None and self.driver_identity is None:
            raise Refused("cancel: the job's driver has not called ray.init yet (there is nothing of Ray to cancel); "
                          "`gkd-tui dump-stacks driver` shows where it is")
        return self._forward("cancel")(args, by)

    def _op_dump_local(self, args: dict, by: str) -> dict:
        dump_id = args.get("dump_id") or f"dump-{self.seq}"
        return self.local_stacks.dump(self.state, args.get("targets") or [], dump_id, by)

    def _forward_stacks(self, args: dict) -> None:
        """Workers of a foreign job on other nodes: its driver captures them there (remote_stacks)."""
        self._forward("dump_stacks")(args, "supervisor")

    def _take_local_stacks(self) -> None:
        results = self.local_stacks.results
        while not results.empty():
            self.emit(results.get_nowait())

    def _serve_drivers(self) -> None:
        for _ in range(100):
            try:
                frames = self.drivers.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2 and frames[1] == b"hello":
                self.driver_identity = frames[0]

    def _serve_monitor(self, mon: zmq.Socket) -> None:
        while mon.poll(0):
            try:
                recv_monitor_message(mon, zmq.NOBLOCK)
            except (zmq.Again, ValueError):
                return
            if mon is self._ingest_monitor:
                self.rejects.add(ev.Rejected("unauthenticated", "a tcp sender without the run's CurveZMQ key "
                                                                 "(refused in the handshake)"), "ingest ")
            else:
                self._auth_refused += 1

    def _op_open_ingest(self, args: dict, by: str) -> dict:
        """The tcp ingest for workers on other nodes, on ``host`` (the head node's Ray address),
        CurveZMQ with the run's ingest keys (RUN/keys). Opened once; asked again, the same."""
        if self.ingest_tcp is not None:
            return {"endpoint": self.ingest_tcp.last_endpoint.decode()}
        host = args.get("host")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise Refused(f"open_ingest: host {str(host)[:60]!r} is not an IP address") from None
        if ip.is_unspecified and host != self.cfg.telemetry.bind_host:
            raise Refused(f"open_ingest: {host} would listen on every interface; set telemetry.bind_host "
                          f"to {host} to allow it")
        keys = self.run_dir / "keys"
        ingest.create_keys(keys)
        self._zap().configure_curve(domain=ingest.ZAP_DOMAIN, location=str(keys / "ingest_authorized"))
        sock = self._pull()
        ingest.server_socket(sock, keys)
        self._ingest_monitor = sock.get_monitor_socket(AUTH_FAILURES)
        self._monitors.append(self._ingest_monitor)
        try:
            sock.bind(f"tcp://{f'[{host}]' if ip.version == 6 else host}:*")
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise Refused(f"open_ingest: cannot listen on {host}: {e}") from None
        self.ingest_tcp = sock
        self.endpoints["ingest_tcp"] = sock.last_endpoint.decode()
        rundir.write_private_json(self.run_dir / "endpoints.json", self.endpoints)
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._ingest_monitor, zmq.POLLIN)
        return {"endpoint": self.endpoints["ingest_tcp"]}

    # --- the driver ----------------------------------------------------------------------

    def _spawn(self, config_path: Path) -> None:
        if self.adopt:
            return self._adopt()
        if self.command:
            return self._spawn_command()
        env = dict(os.environ)
        env.update({
            "GKD_RUN_DIR": str(self.run_dir), "GKD_RUN_ID": self.run_id, "GKD_INGEST": self.endpoints["ingest"],
            "GKD_COMMANDS": self.endpoints["driver"], "GKD_CONTROL": self.endpoints["control"],
            "GKD_CONFIG": str(config_path), "PYTHONUNBUFFERED": "1",
            "GKD_RESTART": str(self.restarts), "GKD_SUPERVISOR_PID": str(os.getpid()),
        })
        argv = [sys.executable, "-m", self.driver_module, "--config", str(config_path), "--run-dir", str(self.run_dir)]
        self.driver_identity = None
        self.driver = DriverProcess(argv, env, self.run_dir / "logs" / "driver.log")
        self.emit(ev.RunEvent(state="running", restart=self.restarts, config_digest=config_mod.digest(self.cfg),
                              total_steps=self.cfg.trainer.total_steps,
                              reason=f"driver pid {self.driver.pid}"))

    def _adopt(self) -> None:
        try:
            self.driver = AdoptedProcess(self.adopt)
        except ProcessLookupError as e:
            self.emit(ev.RunEvent(state="failed", exit_code=0, reason=f"{e}: it ended before its run began"))
            self._ended_at = time.monotonic()
            return
        self.emit(ev.RunEvent(state="running", config_digest=config_mod.digest(self.cfg),
                              reason=f"watching pid {self.adopt}, started by its user: "
                                     f"{shlex.join(self.driver.argv)}"[:500]))

    def _spawn_command(self) -> None:
        env = job_env.command_env(os.environ, run_id=self.run_id, run_dir=str(self.run_dir),
                                  ingest=self.endpoints["ingest"], heartbeat=self.cfg.telemetry.heartbeat_s,
                                  commands=self.endpoints["driver"], control=self.endpoints["control"])
        env.update({"GKD_RESTART": str(self.restarts),
                    "GKD_SUPERVISOR_PID": str(os.getpid())})
        self.driver_identity = None
        try:
            self.driver = DriverProcess(self.command, env, self.run_dir / "logs" / "driver.log")
        except OSError as e:  # no such program, not executable: the run fails, said, the supervisor stays
            self.driver = None
            self._exit_status = 127 if isinstance(e, FileNotFoundError) else 126
            self.emit(ev.RunEvent(state="failed", restart=self.restarts, exit_code=self._exit_status,
                                  reason=f"cannot start {shlex.join(self.command)}: {e}"))
            self._ended_at = time.monotonic()
            return
        self.emit(ev.RunEvent(state="running", restart=self.restarts, config_digest=config_mod.digest(self.cfg),
                              reason=f"driver pid {self.driver.pid}: {shlex.join(self.command)}"[:500]))

    def _watch_driver(self) -> None:
        d = self.driver
        if d is None:
            if self._pending_config is not None and not self._stopping:  # a restart after the run ended
                self._start_restart()
            return
        d.tick()
        code = d.poll()
        if code is None:
            return
        self.driver = None
        if self._pending_config is not None and not self._stopping:
            self.emit(ev.RunEvent(state="restarting", restart=self.restarts + 1, exit_code=code,
                                  reason=f"old driver {describe_exit(code)}; starting restart {self.restarts + 1}"))
            self._start_restart()
            return
        tail = d.log_tail()
        if self._stopping:
            state, status = "stopped", STOPPED_EXIT
        elif code == 0:
            state, status = "finished", 0
        else:
            state, status = "failed", code if code > 0 else 128 - code
        self._exit_status = status
        self._restate_silent(everyone=True)  # the workers' last words before the run's
        reason = describe_exit(code)
        if isinstance(d, AdoptedProcess):  # not our child: its exit code went to the shell that started it
            reason, code = f"pid {d.pid} exited (its exit code went to the shell that started it)", None
        self.emit(ev.RunEvent(state=state, restart=self.restarts, exit_code=code, reason=reason,
                              log_tail=tail if state != "finished" else tail[-3:]))
        self._ended_at = time.monotonic()
        self._evaluate_alerts()  # now, not at the next tick: the supervisor may be about to exit

    def _start_restart(self) -> None:
        self.restarts += 1
        path, self._pending_config = self._pending_config, None
        self._ended_at = None
        self._spawn(path)

    def request_stop(self, grace_s: float | None = None) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._pending_config = None
        if self.driver is not None:
            self.driver.terminate(self.grace_s if grace_s is None else grace_s)
        elif self._ended_at is None:
            self._ended_at = time.monotonic()

    # --- the loop ------------------------------------------------------------------------

    def _evaluate_alerts(self) -> None:
        now = time.time()
        wanted = alerts.evaluate(self.state, now, self.cfg.telemetry.stall_s, self.cfg.telemetry.heartbeat_s)
        if self.rejects.total:
            wanted.append(ev.AlertEvent(
                severity="warn", code="ingest_rejected",
                message=f"{self.rejects.total} messages refused: "
                        + ", ".join(f"{k} {v}" for k, v in sorted(self.rejects.counts.items())),
                hint="unauthenticated: something without the run's key tried the tcp ingest (a stranger, or "
                     "a worker of another run); otherwise a sender speaks another protocol version or sends "
                     "corrupt data. Nothing of theirs was recorded; the run goes on",
            ))
        if self._auth_refused:
            wanted.append(ev.AlertEvent(
                severity="warn", code="auth_refused",
                message=f"{self._auth_refused} tcp connection(s) refused: no valid CurveZMQ key",
                hint="only clients holding RUN/keys/client.key_secret may connect",
            ))
        for a in alerts.diff(self.state, wanted):
            if a.code == "ingest_rejected" and self.rejects.total == self._rejects_reported:
                continue
            if a.code == "auth_refused":
                if self._auth_refused == self._auth_reported:
                    continue
                self.emit(ev.ActionEvent(op="connect", by="tcp", ok=False,
                                         result=f"{self._auth_refused - self._auth_reported} refused: "
                                                "CurveZMQ authentication failed"))
                self._auth_reported = self._auth_refused
            self.emit(a)
        self._rejects_reported = self.rejects.total
        self._auto_dump_stacks(time.monotonic())

    def _auto_dump_stacks(self, mono: float) -> None:
        """Two stacks of every worker named late, a few seconds apart, through the driver (or taken here,
        for a command run)."""
        if self.local_stacks is not None:
            due = self.auto_stacks.due(self.state, mono)
            if due:
                self.local_stacks.dump(self.state, due, f"auto-{self.seq}", "diagnosis")
            return
        if self.driver is None or self.driver_identity is None:
            return  # nobody to ask yet: the alert stands without a stack, and they are taken once it can
        due = self.auto_stacks.due(self.state, mono)
        if due:
            try:
                self._forward("dump_stacks")({"targets": due, "dump_id": f"auto-{self.seq}"}, "diagnosis")
            except Refused:
                pass  # the driver is exiting: its workers' stacks go with it

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def serve(self) -> int:
        """Run until the driver's run ends (plus ``linger_s``) or a stop; returns the exit status."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        tel = self.cfg.telemetry
        if self.resuming:
            self.emit(ev.RunEvent(state="restarting", restart=self.restarts, config_digest=config_mod.digest(self.cfg),
                                  total_steps=self.cfg.trainer.total_steps,
                                  reason=f"its supervisor (pid {self.resumed_from_pid or '?'}) was gone; supervisor pid "
                                         f"{os.getpid()} takes the run over and resumes it from its latest checkpoint",
                                  heartbeat_s=tel.heartbeat_s, heartbeat_log_s=tel.heartbeat_log_s))
        else:
            self.emit(ev.RunEvent(state="starting", config_digest=config_mod.digest(self.cfg),
                                  total_steps=None if self.foreign else self.cfg.trainer.total_steps,
                                  reason=f"a job of its own, telemetry config from {self.config_source}"
                                  if self.foreign else f"config from {self.config_source}",
                                  heartbeat_s=tel.heartbeat_s, heartbeat_log_s=tel.heartbeat_log_s))
        self.emit(ev.LogEvent(message=f"supervisor pid {os.getpid()}: run directory {self.run_dir}, control "
                                      f"{self.endpoints['control']}, workers push to {self.endpoints['ingest']}"))
        self._spawn(self.config_path)
        self.log.flush()
        # last: whoever finds endpoints.json finds a run with its first events on disk
        rundir.write_private_json(self.run_dir / "endpoints.json", self.endpoints)
        poller = self._poller
        for s in (self.ingest, self.control, self.drivers, self.control_tcp, *self._monitors):
            if s is not None:
                poller.register(s, zmq.POLLIN)
        next_chores = 0.0
        try:
            while True:
                ready = dict(poller.poll(TICK_S * 1000))
                if self.ingest in ready:
                    self._drain_ingest()
                if self.ingest_tcp is not None and self.ingest_tcp in ready:
                    self._drain_ingest(self.ingest_tcp)
                if self.control in ready:
                    self._serve_control(self.control, "ipc")
                if self.control_tcp is not None and self.control_tcp in ready:
                    self._serve_control(self.control_tcp, "tcp")
                if self.drivers in ready:
                    self._serve_drivers()
                for mon in self._monitors:
                    if mon in ready:
                        self._serve_monitor(mon)
                now = time.monotonic()
                if now < next_chores:
                    continue  # under load, batch the chores: one flush per FLUSH_EVERY_S, not per event
                next_chores = now + FLUSH_EVERY_S
                if self._signalled:
                    self._signalled = False
                    self.request_stop()
                self._watch_driver()
                stragglers.keep_up(self.state)
                if now >= self._next_alerts:
                    self._restate_silent()  # at the alerts' pace: a walk over every worker
                    self._evaluate_alerts()
                    # every ALERT_EVERY_S, or less often when a pass costs more than a fifth of that
                    # (65,536 workers): the diagnosis never crowds out the events it reads
                    took = time.monotonic() - now
                    self._next_alerts = now + max(ALERT_EVERY_S, ALERT_SHARE_INV * took)
                if self.local_stacks is not None:
                    self._take_local_stacks()
                if self._beats_kept:
                    self._write_beats()
                self.log.flush()
                self._keyframe(self.keyframes.tick(self.state, self.log, self.seq))  # forks when one is due
                if self._ended_at is not None and self.driver is None:
                    if self._stopping or now - self._ended_at >= self.linger_s:
                        break
        finally:
            self._drain_ingest()  # what the workers said last is worth keeping
            if self.ingest_tcp is not None:
                self._drain_ingest(self.ingest_tcp)
            self._restate_silent(everyone=True)
            self._keyframe(self.keyframes.close())
            self.close()
        return self._exit_status

    def _keyframe(self, trouble: str) -> None:
        if trouble:
            self.emit(ev.LogEvent(level="warn", message=trouble))

    def close(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            self.driver.kill_now()
        if self._beats_kept:
            self._write_beats()
        self.log.close()
        for mon in self._monitors:
            mon.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        self.ctx.destroy(linger=500)
        sockdir = rundir.socket_dir(self.run_dir)
        for name in SOCKETS:
            try:
                (sockdir / name).unlink()
            except FileNotFoundError:
                pass
