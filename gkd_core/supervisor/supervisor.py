"""The supervisor: owns RUN/, the event log, the RunState and the driver process.

One thread, one ``zmq.Poller`` loop with a 100 ms tick, over parts that each do one thing:
``Sockets`` (private ipc, authenticated tcp), the ``Recorder`` (every event stamped, logged,
published and applied), ``control_ops`` (a request checked, answered and recorded), ``DriverLife``
(the driver started, watched, restarted, stopped). The supervisor answers control requests itself,
so every op is answered within a bounded time even when the driver is hung, and it runs the
diagnosis on its RunState.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from gkd_core import config as config_mod
from gkd_core import diagnosis, rundir
from gkd_core.diagnosis import plan
from gkd_core.runlog import reader
from gkd_core.runlog.eventlog import EventLog
from gkd_core.runlog.heartbeats import HeartbeatLog
from gkd_core.runlog.keyframes import KeyframeWriter
from gkd_core.state import RunState, encode_state
from gkd_core.supervisor import alerts, control_ops, drivers
from gkd_core.supervisor.control_ops import Asked, Refused
from gkd_core.supervisor.driver_life import DriverLife
from gkd_core.supervisor.heap import Heap
from gkd_core.supervisor.ingest import Ingest
from gkd_core.supervisor.oom_watch import OomWatch
from gkd_core.supervisor.recorder import Recorder
from gkd_core.supervisor.sockets import Sockets
from gkd_core.supervisor.unattended import unattended_part
from gkd_core.supervisor.unattended_settings import UnattendedConfig
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import IngestOpened, Pong, Receipt, Restarted, Stopping

TICK_S = 0.1
FLUSH_EVERY_S = 0.05  # chores (flush, driver watch) at most this often; the crash-loss bound
DEFAULT_DRIVER = "gkd_core.trainer.driver"


class Supervisor:
    def __init__(self, cfg: config_mod.Config, *, config_source: str = "the embedded default",
                 home: Path | None = None, run_id: str | None = None, driver_module: str = DEFAULT_DRIVER,
                 linger_s: float = 0.0, grace_s: float = 10.0, resume: Path | None = None,
                 command: list[str] | None = None, adopt: int | None = None, ray_address: str = "",
                 unattended: UnattendedConfig | None = None):
        """``resume``: the directory of a run whose supervisor is gone (``gkd-tui restart``): its log
        is taken over and its driver started again, which resumes from the latest checkpoint.
        ``command``: any command as the run's driver (``launch -- COMMAND``), its processes watched
        through the run's environment (gkd_core/integrations). ``adopt``: the pid of a job its user started,
        which asked for a run of its own (``GKD_WATCH=1``, gkd_core/integrations/opt_in.py). ``ray_address``:
        a Ray cluster whose jobs are looked at through its state API (``attach --ray-address``). ``unattended``:
        where its alerts and metrics go (supervisor/unattended.py)."""
        self.cfg = cfg = config_mod.absolute_paths(cfg, Path.cwd())
        self.config_source = config_source
        self.linger_s = linger_s
        self.grace_s = grace_s
        os.umask(0o077)  # everything this process creates (sockets, logs, keys) is private
        self.resuming, self.resumed_from_pid = resume is not None, 0
        self.run_dir = resume if resume is not None else rundir.create_run_dir(home, run_id)
        self.run_id = self.run_dir.name
        # the job, asked the same way whatever its kind (supervisor/drivers.py); its process's life is ``life``'s
        reach = drivers.Reach(hand=lambda args, asked: self.life.forward(args, asked, self.state.state),
                              alive=lambda: self.life.alive(), connected=lambda: self.life.connected())
        self.driver = drivers.driver_of(reach, self.run_dir, driver_module, command, adopt, ray_address)
        self.cfg = cfg = self.driver.settings(cfg)
        self.state = RunState()
        self._auth_refused = self._auth_reported = self._rejects_reported = 0
        self._signalled = False
        self.passes = alerts.Passes()
        self.auto_stacks = diagnosis.AutoStacks()
        self._started_mono = time.monotonic()
        seq, restarts = 0, 0
        if resume is not None:  # a run whose supervisor is gone: its state from its log
            taken = reader.take_over_run(self.run_dir)
            self.state, restarts, self.resumed_from_pid = taken.state, taken.next_restart, taken.gone_pid
            seq = self.state.last_seq
        if resume is None:
            (self.run_dir / "config.yaml").write_text(config_mod.to_yaml(cfg))
        self.sockets = Sockets(self.run_dir, cfg.telemetry, {
            "run_id": self.run_id, "supervisor_pid": os.getpid(), **self.driver.endpoint_fields(),
        })
        self.endpoints = self.sockets.endpoints  # published in endpoints.json once the run's first events are logged
        self.log = EventLog(self.run_dir / "events.jsonl", max_ts=self.state.last_ts)
        self.rec = Recorder(self.run_id, self.state, self.log,
                            HeartbeatLog(cfg.telemetry.heartbeat_log_s, cfg.telemetry.heartbeat_s),
                            self.sockets.publish, seq)
        self.emit = self.rec.emit
        self.unattended = unattended_part(unattended, cfg.recovery, self.run_dir, act=self._act_to_recover,
                                          stop=lambda why: self.life.request_stop(reason=why))
        if self.unattended is not None:
            self.rec.on_alert = self.unattended.alert
            self.endpoints["metrics"] = self.unattended.metrics_address  # ("" when not served)
        self.ingest = Ingest(self.rec, self.sockets)
        self.life = DriverLife(run_dir=self.run_dir, run_id=self.run_id, endpoints=self.endpoints,
                               drivers=self.sockets.drivers, job=self.driver, grace_s=grace_s, restarts=restarts,
                               emit=self.emit)
        self.keyframes = KeyframeWriter(self.run_dir / "keyframes", cfg.telemetry.keyframe_mb)
        self.oom_watch = OomWatch(self.emit, cfg.telemetry.heartbeat_s)
        self.heap = Heap()
        self.config_path = self.run_dir / "restarts" / f"{restarts:03d}.yaml"
        self.config_path.write_text(config_mod.to_yaml(cfg))
        # each op's handler; its arguments are declared in telemetry/ops
        self._ops: dict[str, control_ops.Handler] = {
            "ping": self._op_ping, "snapshot": self._op_snapshot, "stop": self._op_stop,
            "restart": self._op_restart, "open_ingest": self._op_open_ingest, "note": control_ops.note,
            "cancel": lambda args, asked: self.driver.cancel(args, asked, self.state),
            "dump_stacks": lambda args, asked: self.driver.dump_stacks(args, asked, self.state, f"dump-{self.seq}"),
            "pause": self._forward, "resume": self._forward,
        }
        # the answers to the latest acting requests, for a client's retry of one (ipc and tcp alike)
        self._recent_replies = control_ops.RecentReplies()
        self._poller = zmq.Poller()

    @property
    def seq(self) -> int:
        return self.rec.seq

    # --- control -------------------------------------------------------------------------

    def _op_ping(self, args: ops.PingArgs, asked: Asked) -> Pong:
        return Pong(run=self.run_id, seq=self.seq, state=self.state.state, pid=os.getpid(),
                    uptime_s=round(time.monotonic() - self._started_mono, 3))

    def _op_snapshot(self, args: ops.SnapshotArgs, asked: Asked) -> msgspec.Raw:
        """A ``Snapshot``, written here as its bytes: the state of a large run is megabytes, encoded once."""
        driver = self.life.driver
        meta = msgspec.json.encode({
            "pid": os.getpid(), "run_dir": str(self.run_dir), "events_logged": self.log.lines,
            "rejected": dict(self.rec.rejects.counts), "rejected_recent": list(self.rec.rejects.recent),
            "driver_pid": driver.pid if driver else None,
            "driver_connected": self.life.identity is not None,
            "control_repeats": self._recent_replies.repeats,  # retries answered from memory, not acted on
            "alert_passes": self.passes.times.said(),  # (when each pass of the diagnosis ended, its ms)
        })
        return msgspec.Raw(b'{"seq":%d,"supervisor":%s,"state":%s}' % (self.seq, meta, encode_state(self.state)))

    def _op_stop(self, args: ops.StopArgs, asked: Asked) -> Stopping:
        self.life.request_stop(self.grace_s if args.grace_s is ops.UNSET else args.grace_s)
        return Stopping(driver_pid=self.life.driver.pid if self.life.driver else None)

    def _op_restart(self, args: ops.RestartArgs, asked: Asked) -> Restarted:
        life = self.life
        if life.stopping:
            raise Refused("the run is stopping; a restart would be undone at once")
        if life.pending_config is not None:
            raise Refused("a restart is already under way")
        if refusal := self.driver.restart_refusal(args):
            raise Refused(refusal)
        new, changes = plan.compose(self.cfg, self.state, args.shrink, args.overrides)
        result = Restarted(restart=life.restarts + 1, changes=changes, digest=config_mod.digest(new))
        if args.dry_run:
            return result
        path = self.run_dir / "restarts" / f"{life.restarts + 1:03d}.yaml"
        path.write_text(config_mod.to_yaml(new))  # written before it is used
        (self.run_dir / "config.yaml").write_text(config_mod.to_yaml(new))
        self.cfg = new
        result.config = str(path.relative_to(self.run_dir))
        self.emit(ev.RunEvent(state="restarting", restart=life.restarts, config_digest=config_mod.digest(new),
                              reason=f"restart requested by {asked.by}" + (" (smaller)" if args.shrink else "")))
        life.restart_with(path, self.grace_s if args.grace_s is ops.UNSET else args.grace_s)
        return result

    def _act_to_recover(self, args: ops.Args, why: str) -> object:
        """The recovery's op (a restart, a worker stopped for its driver to replace), carried out as a person's."""
        return self._ops[ops.OP_OF[type(args)]](args, Asked(f"the recovery policy: {why}"))

    def _forward(self, args: ops.Handed, asked: Asked) -> Receipt:
        """An op the job's driver carries out (``Driver.forward``)."""
        return self.driver.forward(args, asked, self.state)

    def _op_open_ingest(self, args: ops.OpenIngestArgs, asked: Asked) -> IngestOpened:
        """The tcp ingest for workers on other nodes (Sockets.open_ingest). Opened once; asked again, the same."""
        s = self.sockets
        if (sock := s.ingest_tcp) is None:
            sock = s.open_ingest(args.host or None)
            rundir.write_private_json(self.run_dir / "endpoints.json", self.endpoints)
            self._poller.register(sock, zmq.POLLIN)
            self._poller.register(s.ingest_monitor, zmq.POLLIN)
        return IngestOpened(endpoint=sock.get_string(zmq.LAST_ENDPOINT))

    # --- the loop ------------------------------------------------------------------------

    def _begin_pass(self) -> diagnosis.Pass:
        self.rec.restate_silent()  # (those fallen silent since the last tick: the pass judges what the log says)
        self.oom_watch.check(self.state, time.time())  # a death by the OOM killer is a finding of this pass
        now = alerts.judged_at(time.time(), self.state.newest_beat, self.ingest.behind)
        return alerts.begin(self.state, now, self.cfg.telemetry.stall_s, self.cfg.telemetry.heartbeat_s,
                            setup_s=self.cfg.trainer.init_timeout_s)

    def _evaluate_alerts(self) -> None:
        """A whole pass now (the run ends, or its driver: the supervisor may be about to exit), in place of the one
        under way, whose first rules read the run before."""
        self.passes.drop()
        self._emit_alerts(self._begin_pass().turn() or [])

    def _emit_alerts(self, wanted: list[ev.AlertEvent]) -> None:
        wanted += alerts.refusals(self.rec.rejects, self._auth_refused)
        for a in alerts.diff(self.state, wanted):
            if a.code == "ingest_rejected" and self.rec.rejects.total == self._rejects_reported:
                continue
            if a.code == "auth_refused":
                if self._auth_refused == self._auth_reported:
                    continue
                self.emit(ev.ActionEvent(op="connect", by="tcp", ok=False,
                                         result=f"{self._auth_refused - self._auth_reported} refused: "
                                                "CurveZMQ authentication failed"))
                self._auth_reported = self._auth_refused
            self.emit(a)
        self._rejects_reported = self.rec.rejects.total
        self._auto_dump_stacks(time.monotonic())

    def _auto_dump_stacks(self, mono: float) -> None:
        """Two stacks of every worker named late, a few seconds apart (``Driver.take_stacks``)."""
        if not self.driver.can_take_stacks():
            return  # asked for once they can be taken
        due = self.auto_stacks.due(self.state, mono)
        if due:
            self.driver.take_stacks(due, f"auto-{self.seq}", self.state)

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def serve(self) -> int:
        """Run until the driver's run ends (plus ``linger_s``) or a stop; returns the exit status. One loop: what
        is ready on the sockets read (``_read``), then the chores (``_chores``), at most every FLUSH_EVERY_S."""
        self._begin()
        chores = self._chores()
        next_chores = 0.0
        ended = False  # by the loop's own way out, not an exception: the run's end is worth a keyframe
        try:
            while not ended:
                self.ingest.gather()
                self._read(dict(self._poller.poll(int(TICK_S * 1000))))
                now = time.monotonic()
                if now < next_chores:
                    continue  # under load, batch the chores: one flush per FLUSH_EVERY_S, not per event
                next_chores = now + FLUSH_EVERY_S
                for chore in chores:
                    chore(now)
                ended = self._over(now)
        finally:
            self.ingest.last()
            self.rec.restate_silent(everyone=True)
            self.rec.flush()
            self._keyframe(self.keyframes.close(end_of=(self.state, self.log, self.seq) if ended else None))
            self.close()
        return self.life.exit_status

    def _begin(self) -> None:
        """The run's first events, its driver started, its endpoints published, its sockets polled."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        tel, life, s = self.cfg.telemetry, self.life, self.sockets
        if self.resuming:
            self.emit(ev.RunEvent(state="restarting", restart=life.restarts, config_digest=config_mod.digest(self.cfg),
                                  total_steps=self.cfg.trainer.total_steps,
                                  reason=f"its supervisor (pid {self.resumed_from_pid or '?'}) was gone; "
                                         f"supervisor pid {os.getpid()} takes the run over and resumes it from its "
                                         "latest checkpoint",
                                  heartbeat_s=tel.heartbeat_s, heartbeat_log_s=tel.heartbeat_log_s))
            done = self.state.metrics[-1].step if self.state.metrics else 0  # the newest step the log says done
            if lost := self.driver.steps_lost(self.run_dir, done, self.resumed_from_pid):
                self.emit(ev.LogEvent(level="warn", message=lost))
        else:
            total_steps, said = self.driver.run_said(self.cfg, self.config_source)
            self.emit(ev.RunEvent(state="starting", config_digest=config_mod.digest(self.cfg), total_steps=total_steps,
                                  reason=said, heartbeat_s=tel.heartbeat_s, heartbeat_log_s=tel.heartbeat_log_s))
        self.emit(ev.LogEvent(message=f"supervisor pid {os.getpid()}: run directory {self.run_dir}, control "
                                      f"{self.endpoints['control']}, workers push to {self.endpoints['ingest']}"))
        life.spawn(self.cfg, self.config_path)
        self.log.flush()
        # last: whoever finds endpoints.json finds a run with its first events on disk
        rundir.write_private_json(self.run_dir / "endpoints.json", self.endpoints)
        for sock in (s.ingest, s.control, s.drivers, s.control_tcp, *s.monitors):
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)

    def _read(self, ready: dict) -> None:
        """What is ready: events, control requests (ipc, tcp), the driver's hello, refused tcp connections."""
        s = self.sockets
        self.ingest.read(ready)
        if s.control in ready:
            control_ops.serve(s.control, "ipc", self._ops, self.emit, self._recent_replies)
        if s.control_tcp is not None and s.control_tcp in ready:
            control_ops.serve(s.control_tcp, "tcp", self._ops, self.emit, self._recent_replies)
        if s.drivers in ready:
            self.life.serve_hellos()
        for mon in s.monitors:
            if mon in ready:
                self._auth_refused += s.refusals(mon, self.rec.rejects)

    def _chores(self) -> tuple[Callable[[float], object], ...]:
        """What the loop does between its reads, in this order, each given the (monotonic) time."""
        # between passes, what would fall to the next: the beats of those fallen silent since restated (a few a
        # tick, where a pass seconds apart would find a burst of them), and a slice of each index's feed taken in
        return (self._on_stop_asked, self._watch_driver, lambda now: self.rec.restate_silent(),
                lambda now: diagnosis.keep_up(self.state),
                self._alerts_when_due, lambda now: self.driver.tick(self.state, self.emit), self._tell_unattended,
                lambda now: self.rec.flush(), self.heap.tick,
                lambda now: self._keyframe(self.keyframes.tick(self.state, self.log, self.seq)))  # forks when due

    def _on_stop_asked(self, now: float) -> None:
        if self._signalled:  # (a signal's handler only notes it: the loop acts)
            self._signalled = False
            self.life.request_stop()

    def _watch_driver(self, now: float) -> None:
        if self.life.watch(self.cfg, lambda: self.rec.restate_silent(everyone=True)):
            self._evaluate_alerts()  # now, not at the next tick: the supervisor may be about to exit

    def _alerts_when_due(self, now: float) -> None:
        wanted = self.passes.turn(now, self._begin_pass, self.state.backlog())
        if wanted is not None:
            self._emit_alerts(wanted)
            if self.unattended is not None:
                self.unattended.counts.alert_pass_s = self.passes.last_s

    def _tell_unattended(self, now: float) -> None:
        if self.unattended is not None:
            self.unattended.tick(self.state, time.time(), self.emit, self.seq, self.rec.rejects.total)

    def _over(self, now: float) -> bool:
        """Whether the run is over and its lingering done (a restart asked for, or one a failed run's recovery
        may yet ask for, keeps it, whatever --linger says)."""
        life = self.life
        return (life.ended_at is not None and life.driver is None and life.pending_config is None
                and not (self.unattended is not None and self.unattended.may_restart(self.state))
                and (life.stopping or now - life.ended_at >= self.linger_s))

    def _keyframe(self, trouble: str) -> None:
        if trouble:
            self.emit(ev.LogEvent(level="warn", message=trouble))

    def close(self) -> None:
        if self.unattended is not None:
            self.unattended.close()
        self.life.kill_now()
        self.rec.close()
        self.sockets.close()
