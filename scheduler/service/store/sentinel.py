"""Redis Sentinel discovery: the ``redis+sentinel://`` form of ``SNUGFIT_REDIS_URL``.

Syntax (one URL for every snugfit process: client, schedulers, workers and their RQ queues)::

    redis+sentinel://[user:password@]host1:26379,host2:26379,host3:26379/<service>[/<db>][?opts]
    rediss+sentinel://...    TLS to the sentinels and to the master

``user:password`` authenticate to the *master* (the data ACL user). The sentinels' own auth goes in
the query: ``sentinel_password=...`` and ``sentinel_username=...``. Other query options:
``socket_timeout`` (s, to the master), ``ssl_ca_certs`` / ``ssl_certfile`` / ``ssl_keyfile`` /
``ssl_cert_reqs`` (``rediss+sentinel`` only).

The client is redis-py's ``Sentinel.master_for``: its :class:`SentinelConnectionPool` asks the
sentinels for the master on every new connection, and a reply of ``READONLY`` (the old master came
back as a replica) drops the connection. Every command is retried with exponential backoff for
:data:`FAILOVER_BUDGET_S` on a connection error, so a failover costs each process a pause, not a
crash. Which writes that retry may repeat, and why each is safe, is listed in README (High
availability).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import SSLConnection
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from scheduler.exceptions import ServiceError

__all__ = [
    "FAILOVER_BUDGET_S",
    "SENTINEL_SCHEMES",
    "RediscoveringConnection",
    "SentinelURL",
    "decoded_twin",
    "failover_retry",
    "is_sentinel_url",
    "parse_sentinel_url",
    "sentinel_client",
]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")

#: How long a command keeps retrying through a failover before it raises: with the sentinels'
#: ``down-after-milliseconds 5000`` a failover takes 6-15 s.
FAILOVER_BUDGET_S = 30.0

_BACKOFF_CAP_S = 1.0
_BACKOFF_BASE_S = 0.05

_QUERY_KEYS = {
    "sentinel_password",
    "sentinel_username",
    "socket_timeout",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
}

_SYNTAX = (
    "redis+sentinel://[user:password@]host1:26379,host2:26379/<service>[/<db>]"
    "[?sentinel_password=...] (rediss+sentinel:// for TLS)"
)


class RediscoveringConnection(SentinelManagedConnection):
    """Asks the sentinels for the master on *every* reconnect.

    redis-py's command retry reconnects the same connection object through
    ``connect_check_health``, which reuses the address it last had: after a failover it kept
    dialling the dead master, then the old master back as a replica (READONLY), until the retry
    budget ran out. Re-resolving here makes each retry land on the current master."""

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class RediscoveringSSLConnection(RediscoveringConnection, SSLConnection):
    pass


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    options: dict[str, str] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse ``url``; raises :class:`ServiceError` naming the part that is wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise ServiceError(f"not a Sentinel URL: scheme {parts.scheme!r}; use {_SYNTAX}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    sentinels: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "26379"
        try:
            sentinels.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ServiceError(
                f"sentinel address {item!r} in the Redis URL has a bad port; use {_SYNTAX}"
            ) from None
    if not sentinels:
        raise ServiceError(f"the Sentinel URL names no sentinel host; use {_SYNTAX}")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ServiceError(
            f"the Sentinel URL must name the master service (and optionally a db) as its path; "
            f"got {parts.path!r}; use {_SYNTAX}"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ServiceError(
            f"the db in the Sentinel URL must be an integer; got {path[1]!r}"
        ) from None
    options: dict[str, str] = {}
    for k, v in parse_qs(parts.query, keep_blank_values=True).items():
        if k not in _QUERY_KEYS:
            raise ServiceError(
                f"unknown Sentinel URL option {k!r}; use one of {', '.join(sorted(_QUERY_KEYS))}"
            )
        options[k] = v[-1]
    return SentinelURL(
        sentinels=sentinels,
        service=unquote(path[0]),
        db=db,
        username=username,
        password=password,
        ssl=scheme == "rediss+sentinel",
        options=options,
    )


def failover_retry(budget_s: float = FAILOVER_BUDGET_S) -> Retry:
    """Exponential backoff (50 ms doubling, capped at 1 s) for about ``budget_s`` seconds."""
    retries, waited, delay = 0, 0.0, _BACKOFF_BASE_S
    while waited < budget_s:
        waited += min(delay, _BACKOFF_CAP_S)
        delay *= 2
        retries += 1
    return Retry(ExponentialBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S), retries)


def _ssl_kwargs(spec: SentinelURL, flag: bool = True) -> dict[str, Any]:
    if not spec.ssl:
        return {}
    out: dict[str, Any] = {"ssl": True} if flag else {}
    for k in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
        if k in spec.options:
            out[k] = spec.options[k]
    return out


def sentinel_client(url: str, **extra: Any) -> redis.Redis:
    """A bytes-mode client on the master that ``url``'s sentinels name, retrying through a
    failover. ``extra`` goes to the master connections (e.g. ``health_check_interval``)."""
    spec = parse_sentinel_url(url)
    tls = _ssl_kwargs(spec)
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0, **tls}
    if "sentinel_password" in spec.options:
        sentinel_kwargs["password"] = spec.options["sentinel_password"]
    if "sentinel_username" in spec.options:
        sentinel_kwargs["username"] = spec.options["sentinel_username"]
    master_kwargs: dict[str, Any] = {
        "db": spec.db,
        "username": spec.username,
        "password": spec.password,
        "socket_connect_timeout": 1.0,
        "socket_keepalive": True,
        "retry": failover_retry(),
        "connection_class": RediscoveringSSLConnection if spec.ssl else RediscoveringConnection,
        **_ssl_kwargs(spec, flag=False),
        **extra,
    }
    if "socket_timeout" in spec.options:
        master_kwargs["socket_timeout"] = float(spec.options["socket_timeout"])
    sentinel = Sentinel(spec.sentinels, sentinel_kwargs=sentinel_kwargs)
    client: redis.Redis = sentinel.master_for(
        spec.service, redis_class=redis.Redis, **master_kwargs
    )
    return client


def decoded_twin(client: redis.Redis, **overrides: Any) -> redis.Redis | None:
    """A client with the same Sentinel discovery as ``client`` but ``overrides`` (e.g.
    ``decode_responses=True``), or None when ``client`` is not Sentinel-managed."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("connection_pool", None)
    kwargs.update(overrides)
    twin_pool = SentinelConnectionPool(
        pool.service_name,
        pool.sentinel_manager,
        connection_class=pool.connection_class,
        is_master=pool.is_master,
        check_connection=pool.check_connection,
        **kwargs,
    )
    return redis.Redis(connection_pool=twin_pool)
