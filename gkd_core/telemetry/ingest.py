"""How a process on any node of the run reaches its supervisor with events.

On the supervisor's node, events go to an ipc socket in the run's private socket folder (0700,
the socket 0600): no other user can connect to it. A worker on another node cannot reach that
file, so when the Ray cluster has more than one node the driver asks the supervisor to open a
tcp ingest on the head node's Ray address (never 0.0.0.0), authenticated with CurveZMQ: the run's
own ingest key pair, made per run under ``RUN/keys`` and handed to the workers through Ray (never
over the event path), is the only client key let in. A sender without it fails the handshake,
before any frame of its reaches the supervisor, and is counted as ``unauthenticated``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import zmq
import zmq.auth

from gkd_core.telemetry import control, ops

ZAP_DOMAIN = "ingest"  # the control sockets' keys (domain "*") do not open the ingest, nor the reverse


class Curve(msgspec.Struct, frozen=True):
    """A client's CurveZMQ keys (Z85 text): the server's public key and its own pair."""

    server_public: str
    public: str
    secret: str


class IngestRoute(msgspec.Struct):
    """Where the run's events go, for a process on any node."""

    local: str  # ipc:// on the supervisor's node
    head_node: str = ""  # the Ray node id of the supervisor's node
    remote: str = ""  # tcp:// for the other nodes, CurveZMQ
    curve: Curve | None = None
    relays: dict[str, str] = {}  # Ray node id -> its node agent's relay (ipc on that node)
    relay_names: dict[str, str] = {}  # Ray node id -> the relay's src (``agent/<node>``)

    def pick(self, node_id: str) -> tuple[str, Curve | None]:
        """(address, keys or None) for a worker on ``node_id``: its node's relay, when there is one."""
        if node_id in self.relays:
            return self.relays[node_id], None
        return self.direct(node_id)

    def direct(self, node_id: str) -> tuple[str, Curve | None]:
        """(address, keys or None) of the supervisor itself, for a process on ``node_id``."""
        if not self.remote or not node_id or node_id == self.head_node:
            return self.local, None
        return self.remote, self.curve


def create_keys(keys_dir: Path) -> None:
    """The ingest's server pair and the run's client pair, 0600; the client's public key is the one
    authorized (``ingest_authorized/``). Idempotent: a restarted driver finds the same keys."""
    if not (keys_dir / "ingest.key_secret").exists():
        control.create_keys(keys_dir, server="ingest_server", client="ingest", authorized="ingest_authorized")


def server_socket(sock: zmq.Socket, keys_dir: Path) -> None:
    """Make ``sock`` the CurveZMQ server of the ingest (before bind)."""
    control.server_curve(sock, keys_dir, server="ingest_server")
    sock.zap_domain = ZAP_DOMAIN.encode()


def client_keys(keys_dir: Path) -> Curve:
    """The run's client keys, for the driver to hand to its workers."""
    public, secret = zmq.auth.load_certificate(str(keys_dir / "ingest.key_secret"))
    server, _ = zmq.auth.load_certificate(str(keys_dir / "ingest_server.key_secret"))
    assert secret is not None  # (a key_secret file holds both keys)
    return Curve(server_public=server.decode(), public=public.decode(), secret=secret.decode())


def open_remote(control_address: str, host: str, keys_dir: Path, by: str = "driver") -> tuple[str, Curve]:
    """Ask the supervisor (its control socket) for the tcp ingest on ``host``: (its endpoint, the run's
    client keys to hand to the workers on other nodes). Raises with the reason when it cannot."""
    if not control_address:
        raise RuntimeError("no supervisor control socket (GKD_CONTROL) in this process's environment")
    with control.ControlClient(control_address, timeout_s=5.0, retries=1, by=by) as c:
        endpoint = c.call(ops.OpenIngestArgs(host=host)).endpoint
    return endpoint, client_keys(keys_dir)


def client_socket(sock: zmq.Socket, curve: Curve) -> None:
    """Make ``sock`` a CurveZMQ client with the run's keys (before connect)."""
    sock.curve_serverkey = curve.server_public.encode()
    sock.curve_publickey = curve.public.encode()
    sock.curve_secretkey = curve.secret.encode()
