"""Starting the server: in the foreground (`parley serve`) or on a background thread (tests, embedding)."""
from __future__ import annotations

import socket
import sys
import threading
import time
from ipaddress import ip_address

import uvicorn

from server.app import ServerSettings, build_app
from server.bridge import ServerBridge


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


BACKLOG = 2048  # uvicorn's own default: connections waiting for an accept


def make_server(bridge: ServerBridge, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                log_level: str = "warning", settings: ServerSettings | None = None) -> uvicorn.Server:
    settings = settings or ServerSettings(bound_host=host)
    raise_open_files_limit()
    config = uvicorn.Config(build_app(bridge, api_key, settings), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5, lifespan="off")
    return _Server(config)


def raise_open_files_limit(cap: int = 65536) -> None:
    """Lifts the soft limit on open files to the hard one (at most `cap`), as vLLM's server does: each client holds a
    socket, and under a desktop's soft limit (1024; macOS 256) a few hundred at once used up the descriptors the engine
    needs too, failing every generation in flight with 'Too many open files'."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    for target in (wanted, min(wanted, 10240)):  # macOS refuses more than its OPEN_MAX (10240) for some processes
        if target <= soft:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return
        except (ValueError, OSError):
            continue


class _Server(uvicorn.Server):
    """Tells the app it is stopping before waiting on its connections: the answers in flight end at once with a
    clear error, rather than being cut (and logged as a traceback each) once the graceful timeout runs out."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.config.app.state.stopping = True
        await super().shutdown(sockets)


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket `serve` will listen on, bound before any model loads, so that a busy port or an unknown host is one
    line at once rather than an error after the load. ValueError names the address and the reason."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"Cannot listen on {host!r}: not an address or a known host name ({exc}).") from None
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform != "win32":  # a server restarted at once finds its port in TIME_WAIT otherwise
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ValueError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    return sock


def open_for_clients(sock: socket.socket) -> str:
    """Listens on `sock` (bound by `listening_socket`) and returns its URL: a client that connects on reading the URL
    waits in the backlog for uvicorn's first accept, where a socket bound but not yet listening refused it."""
    sock.listen(BACKLOG)
    return listening_url(sock)


def serve_forever(bridge: ServerBridge, host: str, port: int, api_key: str | None,
                  settings: ServerSettings | None = None, sock: socket.socket | None = None) -> None:
    """Serves until interrupted, on `sock` (from `listening_socket`) or a socket of its own on host:port."""
    if not is_loopback(host) and api_key is None:
        say(f"parley: serving on {host} without --api-key: anyone who can reach it can use it.")
    server = make_server(bridge, host, port, api_key, log_level="info", settings=settings)
    if sock is not None:  # uvicorn names the address only of sockets it binds itself: --port 0's would be unknown
        say(f"parley: listening on {open_for_clients(sock)}")
    server.run(sockets=[sock] if sock is not None else None)


def say(line: str) -> None:
    """A line of the server's log on stderr. One that cannot be written (its file's disk is full) is dropped, as
    uvicorn drops its own lines: a server that can still answer must not stop for it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def listening_url(sock: socket.socket) -> str:
    """The API's base URL on a bound socket: 'http://127.0.0.1:8000/v1', 'http://[::1]:8000/v1'."""
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


class BackgroundServer:
    """A server on a daemon thread, for tests and embedding: `with BackgroundServer(bridge) as s: s.url`."""

    def __init__(self, bridge: ServerBridge, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 settings: ServerSettings | None = None):
        self.port = port or free_port(host)
        self.host = host
        self.server = make_server(bridge, host, self.port, api_key, settings=settings)
        self.thread = threading.Thread(target=self.server.run, name="parley-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"The server did not start on {self.host}:{self.port}.")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
