"""A watched process's HTTP: the requests it sends are waits on whoever serves them, the requests it serves
are calls of its own.

A pipeline's rollouts call their inference servers and tools over HTTP, outside any Ray call: without this,
a server whose requests never return reads "idle", and the rollout that awaits it reads only its method.
Patched where each library sends or serves a request, once the job imports it (post_import), never by us:

- sent, a wait inside whatever call the sender is in: aiohttp's ``ClientSession._request``, urllib3's
  ``HTTPConnectionPool.urlopen`` (requests goes through it), urllib's ``AbstractHTTPHandler.do_open``,
  httpx's transports (``HTTPTransport.handle_request``, ``AsyncHTTPTransport.handle_async_request``: the
  OpenAI client and vLLM's and SGLang's go through them).
  Its detail is "POST /generate on 127.0.0.1:8000 (pid 4121)" and its edge in the wait-for graph a
  ``vocab.HttpWait``: the process listening on that address on this node (found once it has lasted long
  enough to be shown, by psutil, and kept a while), which the diagnosis names as its worker.
- served, a call like an async actor's, in the lane of the task that handles it: aiohttp.web's
  ``Application._handle``, and an ASGI app of Starlette's (FastAPI's, as vLLM and SGLang serve under
  uvicorn): ``Starlette.__call__`` for an ``http`` scope. A server with 4 requests stuck reads "4 POST
  /generate in flight", measured by the oldest, and the straggler and stack rules apply to it.

Only the method, the address and the path are kept, never the query string, headers or body (secrets
travel there), and a path's segments that look like ids or keys are said as ``{id}`` (which also keeps a
server's calls to one name a route: ``/items/{id}``); the process serving an address is said by its program
and script alone, never its arguments (an ``--api-key`` travels there). A request is waited on until its
answer's headers come (a server that stalls mid-stream, streaming tokens, is not seen yet), and a served
request until its handler returns (a websocket's upgrade is no request: left alone). A request that returns
within ``SHOW_AFTER_S`` costs a ``Sent``, a call noted and the URL split; the watcher does the rest.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from gkd_core.integrations.activity import Activity
from gkd_core.integrations.calls import running_async
from gkd_core.integrations.post_import import when_imported
from gkd_core.telemetry.events import FLOW_SERVES_MAX
from gkd_core.vocab import HttpWait

LISTENERS_KEEP_S = 10.0  # who listens on an address is looked up again after this (a server started anew)
PATH_MAX = 120  # a path longer than this is cut
# a segment of a path that is an id or a key, not a route's word: digits, a uuid, hex, or a long token
ID_SEGMENT = re.compile(r"^(?:\d+|[0-9a-fA-F-]{8,}|[A-Za-z0-9_\-.~%:+=]{24,})$")
COMMAND_MAX = 80  # the listener's program and script, as a request's detail says them
COMMANDS_KEPT = 256  # listeners' commands remembered (a pid used again after this many is read anew)
SHAPED_KEPT = 512  # paths remembered as their routes
# the addresses this process's served requests came to (host, port), the first FLOW_SERVES_MAX: said in its flow
# events, so that a request to one from another node is known as a request to this worker
SERVED_AT: dict[tuple[Any, ...], None] = {}
_shaped: dict[str, str] = {}  # a path -> its route (a race of two threads writes the same value twice)


def install(activity: Activity, say_once: Callable[[str, BaseException], None]) -> None:
    """Patch each HTTP library as the job imports it (now, for those already imported). A patch that fails is
    said once, and the job and the rest of the watching go on without it."""
    peers = Listeners()
    for module, patch in (("aiohttp.client", _patch_aiohttp_client), ("urllib3.connectionpool", _patch_urllib3),
                          ("urllib.request", _patch_urllib), ("httpx._transports.default", _patch_httpx),
                          ("aiohttp.web_app", _patch_aiohttp_server), ("starlette.applications", _patch_starlette)):
        when_imported(module, functools.partial(_guarded, patch, activity=activity, peers=peers, say_once=say_once))


def _guarded(patch, module: ModuleType, activity: Activity, peers: Listeners,
             say_once: Callable[[str, BaseException], None]) -> None:
    try:
        patch(module, activity=activity, peers=peers, say_once=say_once)
    except Exception as e:  # a release of the library we do not know: its requests go unseen, nothing else
        say_once(f"watching the HTTP requests of {module.__name__}", e)


def _lane() -> Any:
    """The lane a request runs in among the process's calls: the async actor call it is part of, else its
    asyncio task; None off any loop (the thread's)."""
    running = running_async()
    return running[0] if running is not None else None


def _shape(path: str) -> str:
    """The path as a route: its id- or key-like segments said as ``{id}``, cut at ``PATH_MAX``; a path seen
    lately is looked up (a server's requests come to a few routes, thousands a second)."""
    shaped = _shaped.get(path)
    if shaped is None:
        shaped = "/".join("{id}" if ID_SEGMENT.match(part) else part for part in path.split("/"))
        shaped = shaped if len(shaped) <= PATH_MAX else shaped[:PATH_MAX] + "…"
        if len(_shaped) >= SHAPED_KEPT:  # (paths of ids: each new; not to grow forever)
            _shaped.clear()
        _shaped[path] = shaped
    return shaped


class Listeners:
    """Which process of this node listens on an address, from psutil's table of sockets: read at most every
    ``LISTENERS_KEEP_S`` (a read walks every process's sockets), and only for a request that has lasted."""

    def __init__(self):
        self._pids: dict[int, int] = {}  # port -> pid listening on it, on any of this node's addresses
        self._commands: dict[int, str] = {}  # pid -> its command line, shortened
        self._read = 0.0
        self._mine: set[str] | None = None  # this node's addresses
        self._lock = threading.Lock()

    def pid_of(self, host: str, port: int) -> int:
        """The pid listening on ``host:port`` when that is an address of this node; 0 when none is."""
        if not self._on_this_node(host):
            return 0
        with self._lock:
            if time.monotonic() - self._read > LISTENERS_KEEP_S:  # (a miss waits too: a read walks every process)
                self._pids, self._read = _listening(), time.monotonic()
            return self._pids.get(port, 0)

    def command_of(self, pid: int) -> str:
        """``pid``'s command line, shortened ("" when it cannot be read): who serves a request, named."""
        with self._lock:
            if pid not in self._commands:
                if len(self._commands) >= COMMANDS_KEPT:
                    self._commands.clear()
                self._commands[pid] = _command(pid)
            return self._commands[pid]

    def _on_this_node(self, host: str) -> bool:
        if host in ("localhost", socket.gethostname()):
            return True
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False  # a name: resolving it here could block (DNS); treated as another node's
        if ip.is_loopback:
            return True
        if self._mine is None:
            import psutil

            self._mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
        return str(ip) in self._mine


def _command(pid: int) -> str:
    import psutil

    try:
        words = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return ""
    # the program and its script or module, each by its last part; never an argument (a key can be one). A
    # Ray worker's title is one padded word ("ray::InferenceServer   ...")
    words = " ".join(words).split()[:3] if words else []
    said = [words[0].rsplit("/", 1)[-1]] if words else []
    if len(words) > 1 and words[1] == "-m" and len(words) > 2:
        said += ["-m", words[2]]
    elif len(words) > 1 and not words[1].startswith("-") and words[1].endswith(".py"):
        said.append(words[1].rsplit("/", 1)[-1])
    return " ".join(said)[:COMMAND_MAX]


def _listening() -> dict[int, int]:
    import psutil

    out: dict[int, int] = {}
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):  # not allowed to see them (another user's, some systems): nobody known
        return out
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.pid and c.laddr:
            out.setdefault(c.laddr.port, c.pid)
    return out


class Sent:
    """One request in flight from this process: its detail and its edge, found once it is shown."""

    __slots__ = ("method", "host", "port", "path", "peers", "_wait")

    def __init__(self, method: str, host: str, port: int, path: str, peers: Listeners):
        self.method, self.host, self.port, self.path, self.peers = method.upper(), host, port, _shape(path), peers
        self._wait: HttpWait | None = None

    def wait(self) -> HttpWait:
        if self._wait is None:  # (the watcher's thread, once the request has lasted SHOW_AFTER_S)
            self._wait = HttpWait(self.method, f"{self.host}:{self.port}", self.path,
                                  self.peers.pid_of(self.host, self.port))
        return self._wait

    def progress(self) -> str:
        """``waiting for POST /run on 127.0.0.1:9000 (pid 4242: python tool_server.py)``."""
        wait = self.wait()
        command = self.peers.command_of(wait.pid) if wait.pid else ""
        return f"waiting for {wait.spoken(f'pid {wait.pid}: {command}' if command else '')}"

    def waits_on(self) -> list[str]:
        return [self.wait().said()]


def _sending(activity: Activity, peers: Listeners, method: str, host: str | None, port: int | None,
             path: str) -> int:
    sent = Sent(method, host or "?", port or 0, path, peers)
    return activity.enter(f"HTTP {sent.method}", detail=f"waiting for {sent.method} {sent.path or '/'} on "
                                                        f"{sent.host}:{sent.port}",
                          progress=sent.progress, wait=True, waits_on=sent.waits_on, lane=_lane())


def _wrap(owner: type, name: str, note: Callable[..., int | None], activity: Activity, what: str,
          say_once: Callable[[str, BaseException], None]) -> None:
    """``owner.name`` (a library's method, sync or async) as a call of ours: ``note(self, *args, **kwargs)``
    notes it (its token, or None for nothing to note) before the library's own code runs, and it is left when
    that returns or raises. Noting never raises into the job: a failure is said once, as ``what``."""
    original = getattr(owner, name)

    def noted(self, args, kwargs) -> int | None:
        try:
            return note(self, *args, **kwargs)
        except Exception as e:
            say_once(what, e)
            return None

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapper(self, *args, **kwargs):
            token = noted(self, args, kwargs)
            try:
                return await original(self, *args, **kwargs)
            finally:
                if token is not None:
                    activity.leave(token)
    else:
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            token = noted(self, args, kwargs)
            try:
                return original(self, *args, **kwargs)
            finally:
                if token is not None:
                    activity.leave(token)

    setattr(owner, name, wrapper)


def _patch_aiohttp_client(module: ModuleType, activity: Activity, peers: Listeners,
                          say_once: Callable[[str, BaseException], None]) -> None:
    def note(session, method, str_or_url, *args, **kwargs) -> int:
        # (relative to the session's base_url, where it has one and the URL is a path)
        url = urlsplit(str_or_url if isinstance(str_or_url, str) and "://" in str_or_url[:12] else
                       str(session._build_url(str_or_url) if hasattr(session, "_build_url") else str_or_url))
        return _sending(activity, peers, method, url.hostname, url.port or _default_port(url.scheme), url.path)

    _wrap(module.ClientSession, "_request", note, activity, "noting an HTTP request (aiohttp)", say_once)


def _patch_urllib3(module: ModuleType, activity: Activity, peers: Listeners,
                   say_once: Callable[[str, BaseException], None]) -> None:
    def note(pool, method, url, *args, **kwargs) -> int:
        return _sending(activity, peers, method, pool.host, pool.port or _default_port(pool.scheme),
                        urlsplit(url).path)

    _wrap(module.HTTPConnectionPool, "urlopen", note, activity, "noting an HTTP request (urllib3)", say_once)


def _patch_urllib(module: ModuleType, activity: Activity, peers: Listeners,
                  say_once: Callable[[str, BaseException], None]) -> None:
    def note(handler, http_class, req, *args, **kwargs) -> int:
        url = urlsplit(req.full_url)
        return _sending(activity, peers, req.get_method(), url.hostname, url.port or _default_port(url.scheme),
                        url.path)

    _wrap(module.AbstractHTTPHandler, "do_open", note, activity, "noting an HTTP request (urllib)", say_once)


def _patch_httpx(module: ModuleType, activity: Activity, peers: Listeners,
                 say_once: Callable[[str, BaseException], None]) -> None:
    def note(transport, request, *args, **kwargs) -> int:
        url = request.url
        return _sending(activity, peers, request.method, url.host, url.port or _default_port(url.scheme), url.path)

    _wrap(module.HTTPTransport, "handle_request", note, activity, "noting an HTTP request (httpx)", say_once)
    _wrap(module.AsyncHTTPTransport, "handle_async_request", note, activity, "noting an HTTP request (httpx)",
          say_once)


def _patch_aiohttp_server(module: ModuleType, activity: Activity, peers: Listeners,
                          say_once: Callable[[str, BaseException], None]) -> None:
    def note(app, request, *args, **kwargs) -> int | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":  # a connection, not a request
            return None
        transport = request.transport
        _served_at(transport.get_extra_info("sockname") if transport is not None else None)
        return activity.enter_call(f"{request.method} {_shape(request.path)}", lane=_lane())

    _wrap(module.Application, "_handle", note, activity, "noting a served HTTP request (aiohttp.web)", say_once)


def _patch_starlette(module: ModuleType, activity: Activity, peers: Listeners,
                     say_once: Callable[[str, BaseException], None]) -> None:
    def note(app, scope, *args, **kwargs) -> int | None:
        if scope.get("type") != "http":  # "websocket", "lifespan": a connection, a start
            return None
        _served_at(scope.get("server"))
        return activity.enter_call(f"{scope['method']} {_shape(scope['path'])}", lane=_lane())

    _wrap(module.Starlette, "__call__", note, activity, "noting a served HTTP request (Starlette)", say_once)


def _served_at(sockname: Any) -> None:
    """A served request came to ``sockname`` (this end of its connection: ``(host, port, ...)``)."""
    if type(sockname) is tuple and len(sockname) >= 2 and sockname[:2] not in SERVED_AT \
            and len(SERVED_AT) < FLOW_SERVES_MAX:
        SERVED_AT[sockname[:2]] = None


def served_at() -> list[str]:
    """``host:port`` of each address this process's served requests came to."""
    return [f"{host}:{port}" for host, port in list(SERVED_AT)]


def _default_port(scheme: str | None) -> int:
    return 443 if scheme == "https" else 80
