"""The :class:`Store` on a real Redis server.

:class:`RedisStore` implements each state change as one Lua script (``scripts/*.lua``), so a
check and its write are atomic on the server: capacity is re-checked at commit (two schedulers
can never double-book a GPU) and every job transition checks the current state and the attempt
number (a stale worker can never overwrite a newer attempt).

Scripts build key names from the prefix inside Lua, so the layout needs a single Redis server
(standalone or Sentinel-managed), not Redis Cluster.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import orjson
import redis

from scheduler.exceptions import UnknownDependencyError
from scheduler.service.store._add_args import add_args
from scheduler.service.store._resp import (
    Call,
    calls_send,
    eval_direct,
    eval_send,
    packed_hset,
    packer_kwargs,
)
from scheduler.service.store.durability import Durability, NotDurableError
from scheduler.service.store.embedded import connect
from scheduler.service.store.keys import DEFAULT_PREFIX, EVENTS_MAXLEN, LOG_CAP_BYTES, Keys
from scheduler.service.store.protocol import Commit, committed
from scheduler.service.store.records import dumps
from scheduler.service.store.sentinel import decoded_twin

__all__ = ["REQUEUE_FIELDS", "RedisStore", "open_store", "pool_fingerprint"]


def _lua(name: str) -> str:
    return (resources.files("scheduler.service.store") / "scripts" / f"{name}.lua").read_text()


def pool_fingerprint(config_json: str) -> str:
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


# ``moved`` (off a dead or draining node before the job started) is no retry: its cap only
# stops a job from bouncing forever between nodes that keep dying.
_DEFAULT_MAX = {"ooms": "3", "lost": "2", "moved": "1000", "gang": "2"}


_MAX_FIELD = {
    "ooms": "max_oom_retries",
    "lost": "max_retries",
    "moved": "max_moves",
    # A multi-node gang requeued because one of its ranks failed.
    "gang": "max_retries",
}

#: What a requeue may rewrite in the job record: the retry's layout (an OOM retry at a higher
#: tensor parallel degree), never its state, attempt or counters.
REQUEUE_FIELDS = frozenset(
    {
        "spec",
        "submitted_spec",
        "request",
        "predictions",
        "method",
        "reserved_gib",
        "history_request",
    }
)

# The job's own lease, not RQ's timeout, bounds it (timeout -1): RQ must not kill it.
_RQ_JOB_KWARGS: dict[str, Any] = {"timeout": -1, "result_ttl": 3600, "failure_ttl": 86400}
# Jobs per enqueue.lua call.
_ENQUEUE_CHUNK = 1000
# Jobs per fields.lua call (bounds how long one call holds the server).
_FIELDS_CHUNK = 2000


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
        # The store's calls carry thousands of arguments: pack them in one join (_resp).
        packer = packer_kwargs(kwargs)
        kwargs.update(packer)
        # Typed Any: redis-py's stubs cannot express decode_responses=True (str replies).
        # A Sentinel-managed client needs a twin pool that keeps discovering the master.
        self.r: Any = decoded_twin(
            redis_client, decode_responses=True, encoding_errors="replace", **packer
        ) or redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
        )
        self.keys = Keys(prefix)
        self.prefix = prefix
        s = self.r.register_script
        prelude = _lua("prelude")
        # Scripts that create jobs or end them also settle holds and dependencies.
        flow = prelude + _lua("workflow")
        self._add = s(flow + _lua("add"))
        self._commit = s(prelude + _lua("commit"))
        self._start = s(prelude + _lua("start"))
        self._heartbeat = s(prelude + _lua("heartbeat"))
        self._gang_done = s(prelude + _lua("gang_done"))
        self._finish = s(flow + _lua("finish"))
        self._requeue = s(flow + _lua("requeue"))
        self._cancel = s(flow + _lua("cancel"))
        self._reject = s(flow + _lua("reject"))
        self._hold = s(flow + _lua("hold"))
        self._release = s(flow + _lua("release"))
        self._user_requeue = s(flow + _lua("user_requeue"))
        self._init_pool = s(prelude + _lua("init_pool"))
        self._enqueue_lua = s(_lua("enqueue"))
        self._missing_rq = s(_lua("missing_rq"))
        self._fields = s(_lua("fields"))
        self._emit = s(_lua("emit"))
        self._renew = s(_lua("renew"))
        self._release_leader = s(_lua("release_leader"))
        self._queues: dict[str, Any] = {}
        self._rq_template: Any = None  # _rq_fast.TemplateCache, made at the first enqueue
        self.durability = Durability.from_env()

    def close(self) -> None:
        self.r.close()

    # -- jobs ---------------------------------------------------------------------------------

    def add_jobs(self, records: Sequence[Mapping[str, str]]) -> list[bool]:
        """Add the jobs whose ids are new, in order, and wake the leader: per record, whether
        it was added (False: the id exists). One script call for the batch."""
        added, _ = self._add_batch(records, guard=False)
        assert added is not None
        return added

    def add_new_jobs(
        self, records: Sequence[Mapping[str, str]]
    ) -> tuple[list[bool] | None, list[str | None]]:
        """:meth:`add_jobs` unless an id of ``records`` exists already: then nothing is written
        and the answer is ``(None, stored)``, per record the stored ``submitted_spec`` (else
        ``spec``) of an existing id and None for a new one, so a caller can tell a resubmit of
        the same spec from a clash before anything is written. A batch of new ids (the usual
        case) costs one round trip, the check included."""
        return self._add_batch(records, guard=True)

    def _add_batch(
        self, records: Sequence[Mapping[str, str]], *, guard: bool
    ) -> tuple[list[bool] | None, list[str | None]]:
        if not records:
            return [], []
        args = [self.prefix, "1" if guard else "0", "1", *add_args(records)]
        d = self.durability
        if d.replicas:
            # WAIT counts replicas that hold every earlier write of *this* connection, so it
            # rides in the same pipeline as the adds.
            pipe = self.r.pipeline(transaction=False)
            self._add(args=args, client=pipe)
            pipe.execute_command("WAIT", d.replicas, d.timeout_ms)
            out, acked = pipe.execute()
        else:
            out, acked = eval_direct(self.r, self._add, args), None
        if out == "added":  # every job added (add.lua's one-word answer)
            out = [True] * len(records)
        elif out and out[0] == "exists":
            return None, [None if v is None else str(v) for v in out[1:]]
        if acked is not None and int(acked) < d.replicas:
            ids = [rec["id"] for rec in records]
            raise NotDurableError(
                f"{int(acked)} of the {d.replicas} replica(s) SNUGFIT_DURABILITY=replica needs "
                f"confirmed jobs {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''} within "
                f"{d.timeout_ms} ms; they count as not submitted: re-submit them with the same "
                "ids (idempotent), or check the replicas with `snugfit doctor`",
                ids,
            )
        for rec, x in zip(records, out, strict=True):
            if isinstance(x, str) and x.startswith("missing:"):
                raise UnknownDependencyError(
                    f"job {rec['id']!r}: `depends_on` names job {x[8:]!r}, which does not exist; "
                    "submit the parent first (or in the same batch), or fix the id"
                )
        return [bool(x) for x in out], []

    def get_job(self, job_id: str) -> dict[str, str] | None:
        data: dict[str, str] = self.r.hgetall(self.keys.job(job_id))
        return data or None

    def get_fields(self, job_ids: Sequence[str], fields: Sequence[str]) -> list[list[str | None]]:
        """The ``fields`` of each job record (None where absent), one script call per
        :data:`_FIELDS_CHUNK` jobs: the leader reads thousands a second, and one reply per job
        cost more to pack and parse than the server took to answer."""
        if not job_ids or not fields:
            return [[None] * len(fields) for _ in job_ids]
        out: list[list[str | None]] = []
        head = [self.prefix, str(len(fields)), *fields]
        for start in range(0, len(job_ids), _FIELDS_CHUNK):
            chunk = job_ids[start : start + _FIELDS_CHUNK]
            rows = orjson.loads(self._fields(keys=[], args=[*head, *chunk]))
            out += [[None if v is False else v for v in row] for row in rows]
        return out

    def set_fields(self, job_id: str, values: Mapping[str, str]) -> None:
        self.r.hset(self.keys.job(job_id), mapping=dict(values))

    def job_ids(self, state: str | None = None) -> list[str]:
        if state is None:
            return list(self.r.zrange(self.keys.jobs, 0, -1))
        return sorted(self.r.smembers(self.keys.state(state)))

    def count(self, state: str) -> int:
        return int(self.r.scard(self.keys.state(state)))

    def scan_state(self, state: str, cursor: int, count: int) -> tuple[int, list[str]]:
        nxt, ids = self.r.sscan(self.keys.state(state), cursor, count=count)
        return int(nxt), sorted(set(ids))

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
        self,
        config_json: str,
        name: str,
        gpus: Sequence[tuple[int, int, int, int, int]],
        nodes: Sequence[tuple[int, int, int]] = (),
    ) -> str:
        """Publish the pool and start its capacity counters (unless the same pool is there):
        ``gpus`` (index, MiB, mode code, max_shared_jobs, node index), ``nodes`` (index,
        millicores, host MiB); ``scheduler.service._commit.capacity_rows`` builds both."""
        args: list[Any] = [self.prefix, pool_fingerprint(config_json), config_json, name]
        args.append(len(gpus))
        for g in gpus:
            args += list(g)
        for n in nodes:
            args += list(n)
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

    def commit(self, commits: Sequence[Commit], token: str, *, fenced: bool = True) -> list[str]:
        """Commit a chunk in one script: per job ``ok:<capver>``, ``err:`` or ``bad:``; the
        decision of each job answered ``ok`` is then written to its record.

        ``fenced`` (the default) commits only while ``token`` holds the leader lease; an empty
        token never passes. A script that fails as a whole (it should not: every value is
        checked before anything is written) answers ``err:`` for every job of the chunk.
        """
        out = self.commit_send(commits, token, fenced=fenced)()
        calls_send(self.r, self.decision_calls(committed(commits, out)))()
        return out

    def commit_send(
        self, commits: Sequence[Commit], token: str, *, fenced: bool = True
    ) -> Callable[[], list[str]]:
        """:meth:`commit` without the decisions, sent now; the returned call (once) waits for
        and reads its answers. The caller writes the decision of each job answered ``ok``
        before its RQ job (``enqueue_send(..., decisions=)``, as the leader does)."""
        if not commits:
            return list
        args: list[Any] = [self.prefix, token, "1" if fenced else "0", _now()]
        for c in commits:
            args += [c.job_id, c.expected_attempt, c.alloc_json, c.placement_json]
        read = eval_send(self.r, self._commit, args)

        def answers() -> list[str]:
            try:
                got = read()
            except redis.ResponseError as exc:
                return [f"err:commit failed: {str(exc)[:200]}"] * len(commits)
            return [str(x) for x in got]

        return answers

    def decision_calls(self, decisions: Sequence[tuple[str, str]]) -> list[Call]:
        """The writes of committed jobs' decisions, ``(job id, decision JSON)``: a plain HSET
        each. Passed through commit.lua they cost the server several times as much (the
        kilobytes copied into Lua and back out), and the script checks nothing in them."""
        job = self.keys.job
        kw = self.r.connection_pool.connection_kwargs
        enc, errors = kw.get("encoding", "utf-8"), kw.get("encoding_errors", "strict")
        return [(None, packed_hset(job(j), "decision", raw, enc, errors)) for j, raw in decisions]

    # -- transitions --------------------------------------------------------------------------

    def start(
        self,
        job_id: str,
        attempt: int,
        worker: str,
        lease_until_ms: int,
        node_rank: int | None = None,
    ) -> str:
        args: list[Any] = [self.prefix, job_id, attempt, worker, lease_until_ms, _now()]
        if node_rank is not None:
            args.append(node_rank)
        return str(self._start(args=args))

    def gang_rank_done(self, job_id: str, attempt: int, node_rank: int, n_ranks: int) -> str:
        """One rank of a gang ended well: 'last' (finish the job now), 'waiting' or 'stale'."""
        return str(self._gang_done(args=[self.prefix, job_id, attempt, node_rank, n_ranks]))

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
        fields: Mapping[str, str] | None = None,
    ) -> str:
        """Back to pending (fenced by ``attempt``), or failed past the ``counter``'s cap.

        ``fields`` (names in :data:`REQUEUE_FIELDS`; "" deletes one) are written with the
        requeue, atomically, and only when it requeues.
        """
        bad = sorted(set(fields or ()) - REQUEUE_FIELDS)
        if bad:
            raise ValueError(
                f"requeue cannot write {bad}; only {sorted(REQUEUE_FIELDS)} (a retry's layout)"
            )
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
        for k, v in (fields or {}).items():
            args += [k, v]
        return str(self._requeue(args=args))

    def cancel(self, job_id: str, reason: str) -> str:
        return str(self._cancel(args=[self.prefix, job_id, reason, _now()]))

    def hold(self, job_id: str) -> str:
        """Keep a pending job from being placed: ``held``, ``already held``, ``missing`` or the
        state that cannot be held."""
        return str(self._hold(args=[self.prefix, job_id, _now()]))

    def release(self, job_id: str) -> str:
        """Lift a hold: ``released``, ``not held`` or ``missing``."""
        return str(self._release(args=[self.prefix, job_id, _now()]))

    def user_requeue(self, job_id: str) -> str:
        """Back to pending as a new attempt (``scripts/user_requeue.lua`` lists the answers)."""
        return str(self._user_requeue(args=[self.prefix, job_id, _now()]))

    def reject(self, job_id: str, reason: str, decision_json: str) -> str:
        return str(self._reject(args=[self.prefix, job_id, reason, decision_json, _now()]))

    def expired_leases(self, now_ms: int, limit: int = 1000) -> list[str]:
        return list(self.r.zrangebyscore(self.keys.leases, "-inf", now_ms, start=0, num=limit))

    # -- leadership ---------------------------------------------------------------------------

    def acquire_leader(self, token: str, ttl_ms: int) -> bool:
        if self.r.set(self.keys.leader, token, nx=True, px=ttl_ms):
            return True
        return bool(self._renew(keys=[self.keys.leader], args=[token, ttl_ms]))

    def renew_leader(self, token: str, ttl_ms: int) -> bool:
        """Extend the lease only if ``token`` still holds it: never re-create a vanished one (a
        failover can lose the key; the holder must then win it again, as a new leader)."""
        return bool(self._renew(keys=[self.keys.leader], args=[token, ttl_ms]))

    def release_leader(self, token: str) -> None:
        self._release_leader(keys=[self.keys.leader], args=[token])

    def leader(self) -> str | None:
        v = self.r.get(self.keys.leader)
        return None if v is None else str(v)

    # -- queues -------------------------------------------------------------------------------

    def _queue_named(self, name: str) -> Any:
        q = self._queues.get(name)
        if q is None:
            from rq import Queue
            from rq.serializers import JSONSerializer

            q = Queue(name, connection=self.raw, serializer=JSONSerializer)
            self._queues[name] = q
        return q

    def enqueue(self, items: Sequence[tuple[str, str, int, dict[str, Any]]]) -> None:
        """RQ jobs ``(node, job id, attempt, meta)``: JSON-only args.

        Every job is written as rq writes it: rq records one template job, and
        ``scripts/enqueue.lua`` replays it per job (:mod:`._rq_fast`), a chunk of jobs per
        call. rq's own per-job path, in one MULTI/EXEC, is the fallback.
        """
        self.enqueue_send(items)()

    def enqueue_send(
        self,
        items: Sequence[tuple[str, str, int, dict[str, Any]]],
        *,
        decisions: Sequence[tuple[str, str]] = (),
    ) -> Callable[[], Any]:
        """:meth:`enqueue`, sent now; the returned call (once) reads the answers (and raises
        what :meth:`enqueue` would), so the leader settles its next chunk meanwhile.
        ``decisions`` of jobs committed by :meth:`commit_send` are written first, on the same
        connection, so no RQ job is ever there before its job's decision."""
        from scheduler.service.store._rq_fast import by_queue, script_args

        first = self.decision_calls(decisions)
        groups = by_queue(items)
        if not groups:
            return calls_send(self.r, first)
        if self._rq_template is None:
            from scheduler.service.store._rq_fast import TemplateCache
            from scheduler.service.store.keys import JOB_FUNCTION

            self._rq_template = TemplateCache(JOB_FUNCTION, _RQ_JOB_KWARGS)
        tpl = self._rq_template.get(self.raw)
        if tpl is None:
            calls_send(self.r, first)()
            self._enqueue_with_rq(groups)
            return list
        # The decoded client sends them (its packer is the fast one; the script answers a
        # count), without the pipeline's SCRIPT EXISTS round trip.
        calls = script_args(tpl, groups, _ENQUEUE_CHUNK)
        return calls_send(self.r, first + [(self._enqueue_lua, args) for args in calls])

    def _enqueue_with_rq(
        self, by_queue: dict[str, list[tuple[str, str, int, str, dict[str, Any]]]]
    ) -> None:
        from scheduler.service.store.keys import JOB_FUNCTION

        pipe = self.raw.pipeline()
        for name, jobs in by_queue.items():
            q = self._queue_named(name)
            datas = [
                q.prepare_data(
                    JOB_FUNCTION,
                    args=[job_id, attempt],
                    job_id=rq_id,
                    description=desc,
                    meta=meta,
                    **_RQ_JOB_KWARGS,
                )
                for rq_id, job_id, attempt, desc, meta in jobs
            ]
            q.enqueue_many(datas, pipeline=pipe)
        pipe.execute()

    def enqueued(self, node: str, job_id: str, attempt: int) -> bool:
        from scheduler.service.store.keys import rq_job_id

        return bool(self.raw.exists(f"rq:job:{rq_job_id(job_id, attempt)}"))

    def enqueued_many(self, items: Sequence[tuple[str, int]]) -> list[bool]:
        """Whether each ``(job id, attempt)`` has its RQ job (one pipelined round trip)."""
        from scheduler.service.store.keys import rq_job_id

        if not items:
            return []
        pipe = self.raw.pipeline(transaction=False)
        for job_id, attempt in items:
            pipe.exists(f"rq:job:{rq_job_id(job_id, attempt)}")
        return [bool(x) for x in pipe.execute()]

    def maybe_unenqueued(self, job_ids: Sequence[str]) -> list[str]:
        """The jobs of ``job_ids`` that may lack their current attempt's RQ job (one script
        call): every other one has it. A superset: callers check these in full."""
        if not job_ids:
            return []
        return list(self._missing_rq(keys=[], args=[self.prefix, *job_ids]))

    # -- events, history, logs, nodes ---------------------------------------------------------

    def emit(self, events: Sequence[Mapping[str, Any]]) -> None:
        self.emit_send(events)()

    def emit_send(self, events: Sequence[Mapping[str, Any]]) -> Callable[[], Any]:
        """:meth:`emit`, sent now; the returned call (once) reads the answer."""
        if not events:
            return list
        args = [self.prefix, EVENTS_MAXLEN, *(dumps(dict(e)) for e in events)]
        return calls_send(self.r, [(self._emit, args)])

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

    def set_node_admin(self, name: str, state: str | None) -> None:
        if state is None:
            self.r.hdel(self.keys.node_admin, name)
        else:
            self.r.hset(self.keys.node_admin, name, state)

    def node_admin(self) -> dict[str, str]:
        return dict(self.r.hgetall(self.keys.node_admin))


def open_store(url: str | None = None, prefix: str = DEFAULT_PREFIX) -> RedisStore:
    """A :class:`RedisStore` on :func:`connect` (``url`` / env / embedded)."""
    return RedisStore(connect(url), prefix)
