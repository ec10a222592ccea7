"""Serving the dashboard with uvicorn: in the foreground (``snugfit dashboard``) or on a
background thread beside other work (``snugfit scheduler --dashboard``, ``snugfit demo``).

The listening socket is bound here, before uvicorn starts, so a port in use fails at once
with the address in the message, and port 0 picks a free port whose URL is known up front.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from scheduler.exceptions import ServiceError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "RunningDashboard",
    "bind",
    "serve",
    "start_in_thread",
    "url_of",
]

#: Loopback by default: the dashboard shows every job, user and cost of the cluster.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
# An open event stream would keep a graceful shutdown waiting for ever; cut it after this.
_SHUTDOWN_GRACE_S = 2
_START_TIMEOUT_S = 15.0


def bind(host: str, port: int, *, flags: tuple[str, str] = ("--port", "--host")) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 = a free port); ServiceError naming the
    address and the fix (the command's ``flags`` for port and host) when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServiceError(
            f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}; pick a free "
            f"port with {flags[0]} (0 picks one)"
            + (f" or another address with {flags[1]}" if flags[1] else "")
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _server(app: Any, *, log_level: str, access_log: bool) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
        lifespan="off",
    )
    return uvicorn.Server(config)


def serve(
    app: Any, sock: socket.socket, *, log_level: str = "info", access_log: bool = False
) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM (uvicorn's own handlers)."""
    _server(app, log_level=log_level, access_log=access_log).run(sockets=[sock])


@dataclass
class RunningDashboard:
    """A dashboard served on a daemon thread; :meth:`stop` ends it."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def shutdown(self) -> None:
        """As ``stop()``: the name prometheus-client's metrics server uses."""
        self.stop()


def start_in_thread(
    app: Any,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    log_level: str = "warning",
    flags: tuple[str, str] = ("--port", "--host"),
) -> RunningDashboard:
    """Serve ``app`` on a background thread; returns once it accepts connections."""
    sock = bind(host, port, flags=flags)
    url = url_of(sock)
    server = _server(app, log_level=log_level, access_log=False)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="snugfit-dashboard", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        server.should_exit = True
        thread.join(_START_TIMEOUT_S)
        sock.close()
        raise ServiceError(f"the dashboard on {url} did not start; see the log above")
    return RunningDashboard(url, server, thread)
