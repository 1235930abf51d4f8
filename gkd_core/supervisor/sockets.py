"""The supervisor's sockets: private ipc in the run's socket folder, tcp only when asked, with CurveZMQ.

- ``events`` (PUB): every event, as ``[kind, json]``; ``control`` (ROUTER): requests; ``driver``
  (ROUTER): the driver's command channel; ``ingest`` (PULL): the workers' events.
- tcp: ``telemetry.control_tcp`` and ``telemetry.events_tcp`` at start, the ingest for other nodes when
  the driver asks (``open_ingest``); each authenticated, and each refused handshake counted by a monitor.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
from zmq.utils.monitor import recv_monitor_message

from gkd_core import config as config_mod
from gkd_core import rundir
from gkd_core.supervisor.control_ops import Refused
from gkd_core.telemetry import control, ingest, wire

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

SOCKETS = ("events.sock", "control.sock", "driver.sock", "ingest.sock")  # in the run's private socket folder
AUTH_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                 | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


def _ipc(path: Path) -> str:
    return f"ipc://{path}"


class Sockets:
    def __init__(self, run_dir: Path, tel: config_mod.TelemetryConfig, endpoints: dict):
        """Bound at once; ``endpoints`` (what endpoints.json says besides the sockets) gets their addresses."""
        self.run_dir, self.tel = run_dir, tel
        self.ctx = zmq.Context()
        self._authenticator: ThreadAuthenticator | None = None
        self.monitors: list[zmq.Socket] = []
        self.ingest_monitor: zmq.Socket | None = None
        self.ingest_tcp: zmq.Socket | None = None
        sockdir = rundir.socket_dir(run_dir)
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
        self.ingest = self.pull()
        self.ingest.bind(_ipc(sockdir / "ingest.sock"))
        for name in SOCKETS:
            os.chmod(sockdir / name, 0o600)
        self.endpoints = {
            **endpoints,
            "events": self.pub.get_string(zmq.LAST_ENDPOINT),
            "control": self.control.get_string(zmq.LAST_ENDPOINT),
            "ingest": self.ingest.get_string(zmq.LAST_ENDPOINT),
            "driver": self.drivers.get_string(zmq.LAST_ENDPOINT),
            "host": socket.gethostname(),  # where the supervisor's pid lives
        }
        self.control_tcp: zmq.Socket | None = None
        self.events_tcp: zmq.Socket | None = None
        if tel.control_tcp or tel.events_tcp:
            self._bind_tcp()

    def pull(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PULL)
        sock.rcvhwm = 100_000
        sock.linger = 0
        return sock

    def _zap(self) -> ThreadAuthenticator:
        """The CurveZMQ authenticator (a thread), started the first time a tcp socket needs it."""
        if self._authenticator is None:
            from zmq.auth.thread import ThreadAuthenticator

            self._authenticator = ThreadAuthenticator(self.ctx, log=logging.getLogger("gkd.zap"))
            self._authenticator.start()
        return self._authenticator

    def _bind_tcp(self) -> None:
        """Optional tcp endpoints, authenticated with CurveZMQ; refusals are counted by their monitors."""
        tel = self.tel
        keys = self.run_dir / "keys"
        control.create_keys(keys)
        self._zap().configure_curve(domain="*", location=str(keys / "authorized"))
        if tel.control_tcp:
            self.control_tcp = self.ctx.socket(zmq.ROUTER)
            self.control_tcp.linger = 0
            control.server_curve(self.control_tcp, keys)
            self.monitors.append(self.control_tcp.get_monitor_socket(AUTH_FAILURES))
            self.control_tcp.bind(f"tcp://{tel.control_tcp}")
            self.endpoints["control_tcp"] = self.control_tcp.get_string(zmq.LAST_ENDPOINT)
        if tel.events_tcp:
            self.events_tcp = self.ctx.socket(zmq.PUB)
            self.events_tcp.sndhwm = tel.pub_hwm
            self.events_tcp.linger = 0
            control.server_curve(self.events_tcp, keys)
            self.monitors.append(self.events_tcp.get_monitor_socket(AUTH_FAILURES))
            self.events_tcp.bind(f"tcp://{tel.events_tcp}")
            self.endpoints["events_tcp"] = self.events_tcp.get_string(zmq.LAST_ENDPOINT)

    def open_ingest(self, host: object) -> zmq.Socket:
        """The tcp ingest for workers on other nodes, on ``host`` (the head node's Ray address), CurveZMQ with
        the run's ingest keys (RUN/keys); Refused, saying why, when it cannot listen there."""
        try:
            ip = ipaddress.ip_address(host)  # type: ignore[arg-type]
        except ValueError:
            raise Refused(f"open_ingest: host {str(host)[:60]!r} is not an IP address") from None
        if ip.is_unspecified and host != self.tel.bind_host:
            raise Refused(f"open_ingest: {host} would listen on every interface; set telemetry.bind_host "
                          f"to {host} to allow it")
        keys = self.run_dir / "keys"
        ingest.create_keys(keys)
        self._zap().configure_curve(domain=ingest.ZAP_DOMAIN, location=str(keys / "ingest_authorized"))
        sock = self.pull()
        ingest.server_socket(sock, keys)
        monitor = sock.get_monitor_socket(AUTH_FAILURES)
        try:
            sock.bind(f"tcp://{f'[{host}]' if ip.version == 6 else host}:*")
        except zmq.ZMQError as e:
            monitor.close(linger=0)
            sock.close(linger=0)
            raise Refused(f"open_ingest: cannot listen on {host}: {e}") from None
        self.ingest_tcp, self.ingest_monitor = sock, monitor
        self.monitors.append(monitor)
        self.endpoints["ingest_tcp"] = sock.get_string(zmq.LAST_ENDPOINT)
        return sock

    def publish(self, kind: bytes, line: bytes) -> None:
        try:
            self.pub.send(kind, _NOBLOCK_MORE)
            self.pub.send(line, _NOBLOCK)
            if self.events_tcp is not None:
                self.events_tcp.send(kind, _NOBLOCK_MORE)
                self.events_tcp.send(line, _NOBLOCK)
        except zmq.Again:
            pass  # PUB drops for slow subscribers by itself; they see the gap and resnapshot

    def refusals(self, mon: zmq.Socket, rejects: wire.RejectCounter) -> int:
        """What monitor ``mon`` says was refused in the CurveZMQ handshake: a sender's to the ingest is counted
        among ``rejects``; the number of the others (the control's, the events') is returned."""
        others = 0
        while mon.poll(0):
            try:
                recv_monitor_message(mon, zmq.NOBLOCK)
            except (zmq.Again, ValueError):
                break
            if mon is self.ingest_monitor:
                rejects.add(wire.Rejected("unauthenticated", "a tcp sender without the run's CurveZMQ key "
                                                             "(refused in the handshake)"), "ingest ")
            else:
                others += 1
        return others

    def close(self) -> None:
        for mon in self.monitors:
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
