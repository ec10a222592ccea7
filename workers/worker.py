"""``snugfit worker --node NAME``: one RQ worker per node, on exactly one queue, its node's.

The RQ loop only starts jobs (``run_job`` hands each to a supervisor thread that heartbeats its
lease and records its outcome), so all the jobs placed on a node run concurrently. Each RQ job
still stays ``started`` until its run ends, then ends ``finished``, ``failed`` or ``canceled``
with the run's outcome, and the worker shows ``busy`` while it runs any
(:mod:`workers._rq_worker`).

One queue keeps RQ on its safe dequeue path (BLMOVE into a per-worker intermediate list, Redis
>= 6.2); a worker that listens on several queues can lose a job silently (rq#580, #1716). The
worker uses RQ's JSON serializer and an allow-list job class: a job whose payload is not JSON
(pickle bytes, garbage) or whose function is not ``workers.execute.run_job`` is failed and
logged, never executed. Whoever can write to Redis gets no code execution on a GPU node.

GPUs are registered from NVML when it answers, else from the pool file's entry for the node.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rq import Queue
from rq.exceptions import DeserializationError
from rq.job import Job
from rq.serializers import JSONSerializer

from scheduler.core.pool import Pool
from scheduler.service.events import EventLog, event
from scheduler.service.store.keys import JOB_FUNCTION, queue_name
from scheduler.service.store.redis_store import RedisStore
from workers._rq_worker import NodeRQWorker
from workers.exceptions import WorkerError
from workers.execute import WorkerContext, set_context
from workers.mig import MigSlices, mig_control
from workers.mps import MpsDaemons
from workers.nvml import Nvml, mig_devices, open_nvml

__all__ = ["NodeWorker", "UnsafeJobError"]

log = logging.getLogger("snugfit.worker")

#: Longest wait between retries while Redis is unreachable.
_MAX_BACKOFF_S = 2.0


class UnsafeJobError(Exception):
    """An RQ job that is not a snugfit job (foreign function or non-JSON payload)."""


#: RQ job-hash fields naming functions RQ would import and call around ``perform``; snugfit
#: never sets them, so a job that carries one was written by someone else.
_CALLBACK_FIELDS = ("success_callback_name", "failure_callback_name", "stopped_callback_name")


class _AllowListJob(Job):
    # RQ imports these by name from the job hash and calls them outside ``perform`` (after a
    # failure, a success, a stop): past the function allow-list. snugfit uses none, so none is
    # ever resolved, whatever the hash says.
    @property
    def success_callback(self) -> None:  # type: ignore[override]
        return None

    @property
    def failure_callback(self) -> None:  # type: ignore[override]
        return None

    @property
    def stopped_callback(self) -> None:  # type: ignore[override]
        return None

    def _callbacks_named(self) -> list[str]:
        return [
            f"{f}={getattr(self, '_' + f)!r:.80}"
            for f in _CALLBACK_FIELDS
            if getattr(self, "_" + f, None)
        ]

    def perform(self) -> Any:
        named = self._callbacks_named()
        if named:
            reason = f"carries RQ callbacks ({', '.join(named)}); snugfit jobs have none"
            _refuse(self.id, reason)
            raise UnsafeJobError(f"RQ job {self.id}: {reason}; refused")
        try:
            name = self.func_name
        except DeserializationError:
            _refuse(self.id, "payload is not JSON (pickle or garbage)")
            raise UnsafeJobError(f"RQ job {self.id}: payload is not JSON; refused") from None
        if name != JOB_FUNCTION:
            _refuse(self.id, f"function {name!r:.80} is not {JOB_FUNCTION}")
            raise UnsafeJobError(
                f"RQ job {self.id}: function {name!r:.80} is not {JOB_FUNCTION}; refused"
            )
        return super().perform()


def _refuse(rq_id: str, reason: str) -> None:
    from workers.execute import _CONTEXT

    log.warning("refused RQ job %s: %s", rq_id, reason)
    if _CONTEXT is not None and _CONTEXT.events is not None:
        _CONTEXT.events.emit(
            [event("invalid", None, reason=f"RQ job {rq_id}: {reason}", node=_CONTEXT.node)]
        )


def _stop_asked(rq: NodeRQWorker | None) -> bool:
    """A SIGTERM/SIGINT reached RQ's handler: an idle RQ worker only records the date (and
    raises StopRequested inside its loop), a busy one sets ``_stop_requested``."""
    if rq is None:
        return False
    return bool(rq._stop_requested or rq._shutdown_requested_date is not None)


class NodeWorker:
    """The node's worker: context for ``run_job``, node registration, the RQ loop."""

    def __init__(
        self,
        store: RedisStore,
        node: str,
        *,
        pool: Pool | None = None,
        simulate: bool = False,
        time_scale: float = 1.0,
        truth_seed: int = 0,
        lease_s: float = 10.0,
        heartbeat_s: float = 1.0,
        history_path: str | Path | None = None,
        log_path: str | Path | None = None,
        nvml: Nvml | None = None,
        name: str | None = None,
        concurrent: bool = True,
        home: str | Path | None = None,
        node_heartbeat_s: float = 5.0,
    ) -> None:
        if pool is None:
            config = store.pool_config()
            pool = Pool.from_dict(config) if config is not None else None
        if pool is not None and node not in {n.name for n in pool.nodes}:
            # A typo would otherwise wait forever on a queue nobody places onto.
            raise WorkerError(
                f"node {node!r} is not in pool {pool.name!r}; its nodes are: "
                f"{', '.join(n.name for n in pool.nodes)}"
            )
        # How often the node's liveness record is renewed; the scheduler treats the node as
        # down after its --node-stale (15 s by default, three beats).
        self.node_heartbeat_s = float(node_heartbeat_s)
        self.store = store
        self.node = node
        self.concurrent = concurrent
        self.pool = pool
        self.name = name or f"{node}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.nvml = nvml if nvml is not None else (None if simulate else open_nvml())
        local: dict[int, int] = {}
        self.node_config = None
        if pool is not None:
            match = [n for n in pool.nodes if n.name == node]
            if match:
                self.node_config = match[0]
                local = {g: k for k, g in enumerate(match[0].gpu_indices)}
        self.ctx = WorkerContext(
            store=store,
            node=node,
            worker_name=self.name,
            simulate=simulate,
            time_scale=time_scale,
            truth_seed=truth_seed,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            history_path=None if history_path is None else Path(history_path),
            events=EventLog(store, log_path),
            nvml=self.nvml,
            local_index=local,
            mig_uuids=self._mig_uuids(local),
            pool=pool,
        )
        self.ctx.mig = self._mig_slices(local)
        self.ctx.mps = self._mps_daemons(local, home)
        self.queue = Queue(queue_name(node), connection=store.raw, serializer=JSONSerializer)
        self._stop = threading.Event()
        self.refused: list[str] = []
        #: How often a refusing node checks again whether it can work.
        self.recheck_s = 30.0

    def _mig_uuids(self, local: dict[int, int]) -> dict[tuple[int, str, int], str]:
        """(pool GPU index, MIG profile, start slot) -> MIG device UUID, from NVML."""
        if self.nvml is None:
            return {}
        pool_of = {k: g for g, k in local.items()}
        return {
            (pool_of.get(m.parent_index, m.parent_index), m.profile, m.start): m.uuid
            for m in mig_devices(self.nvml)
        }

    def _mig_slices(self, local: dict[int, int]) -> MigSlices | None:
        nc = self.node_config
        if nc is None or nc.mode != "mig" or self.nvml is None or self.ctx.simulate:
            return None
        return MigSlices(
            self.nvml, mig_control(self.nvml), local, nc.mig_layout, self.ctx.mig_uuids
        )

    def _mps_daemons(self, local: dict[int, int], home: str | Path | None) -> MpsDaemons | None:
        nc = self.node_config
        if nc is None or nc.mode != "shared" or self.ctx.simulate:
            return None
        if home is None:
            from scheduler.service.store.embedded import snugfit_home

            home = snugfit_home()
        gpus = sorted(local.values())
        uuids: dict[int, str] = {}
        if self.nvml is not None:
            uuids = {k: self.nvml.device_uuid(k) for k in gpus if k < self.nvml.device_count()}
        return MpsDaemons(Path(home), gpus, uuids, max_jobs=nc.max_shared_jobs)

    def refusals(self) -> list[str]:
        """Why this node cannot run what the pool says it offers (empty: it can). Starts the
        MPS daemons of a shared node (or finds them running)."""
        out: list[str] = []
        if self.ctx.mig is not None:
            out += [f"MIG: {x}" for x in self.ctx.mig.problems()]
        if self.ctx.mps is not None:
            out += self.ctx.mps.ensure()
        return out

    def gpus(self) -> list[dict[str, Any]]:
        """This node's GPUs: NVML's view when present, else the pool file's."""
        if self.nvml is not None:
            return [
                {
                    "index": i,
                    "name": self.nvml.device_name(i),
                    "uuid": self.nvml.device_uuid(i),
                    "memory_gib": round(self.nvml.memory_total_bytes(i) / 2**30, 2),
                    "source": "nvml",
                }
                for i in range(self.nvml.device_count())
            ]
        if self.pool is None:
            return []
        out = []
        for n in self.pool.nodes:
            if n.name == self.node:
                for k, g in enumerate(n.gpu_indices):
                    out.append(
                        {"index": k, "pool_index": g, "name": n.gpu_type, "mode": n.mode}
                        | {"source": "pool"}
                    )
        return out

    def register(self) -> None:
        import json

        self.store.register_node(
            self.node,
            {
                "worker": self.name,
                "host": socket.gethostname(),
                "pid": str(os.getpid()),
                "gpus": json.dumps(self.gpus()),
                "simulated": "1" if self.ctx.simulate else "0",
                "driver": self.nvml.driver_version() if self.nvml is not None else "",
                "heartbeat_at": repr(time.time()),
                # Non-empty: the node takes no placements, and this says why (the scheduler
                # and `snugfit pool` read it).
                "refuse": "; ".join(self.refused),
            },
        )

    def _beat(self) -> None:
        seen: set[bytes] = set()
        while not self._stop.wait(self.node_heartbeat_s):
            try:
                self.store.register_node(self.node, {"heartbeat_at": repr(time.time())})
                seen = self._requeue_stuck(seen)
            except Exception as exc:
                log.warning("node heartbeat failed: %s", exc)

    def _wait_until_fixed(self, burst: bool) -> bool:
        """Heartbeat only while the node refuses work (it stays visible with its reason), and
        check again every ``recheck_s``: True once the operator fixed it (MIG layout created,
        MPS made startable), False on a stop or in burst mode."""
        log.error("node %s refuses work: %s", self.node, "; ".join(self.refused))
        next_check = time.monotonic() + self.recheck_s
        while not burst and not self._stop.wait(1.0):
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + self.recheck_s
            self.refused = self.refusals()
            self.register()
            if not self.refused:
                log.warning("node %s takes work again", self.node)
                return True
        self._stop.set()
        if self.ctx.mps is not None:
            self.ctx.mps.stop()
        return False

    def rq_worker(self, name: str | None = None) -> NodeRQWorker:
        # A SimpleWorker runs jobs in this process: the job's process group, heartbeat and
        # cancellation are ours (in supervisor threads); RQ's work-horse fork would only add a
        # layer, and a forked horse could not keep the supervisors alive. NodeRQWorker keeps
        # each RQ job `started` until its run ends, so `rq info` and rq-dashboard tell the truth.
        return NodeRQWorker(
            [self.queue],
            connection=self.store.raw,
            serializer=JSONSerializer,
            job_class=_AllowListJob,
            name=name or self.name,
        )

    def _requeue_stuck(self, seen: set[bytes]) -> set[bytes]:
        """Put back jobs that sat in RQ's intermediate list (dequeued, never started) for a
        whole node beat: a BLMOVE whose reply a Redis restart lost, or a worker killed between
        dequeue and start. RQ would fail them after a minute, leaving the snugfit job placed
        until its placement lease. A job only passes through that list for milliseconds; if a
        worker is starting it after all, the fenced start lets only one run. Returns what is
        there now, for the next beat."""
        q = self.queue
        r: Any = self.store.raw
        now: set[bytes] = set(r.lrange(q.intermediate_queue_key, 0, -1))
        for rq_id in now & seen:
            if r.lrem(q.intermediate_queue_key, 1, rq_id):
                r.lpush(q.key, rq_id)
                log.warning("requeued RQ job %s: dequeued but never started", rq_id.decode())
        return now - seen

    def _redis_up(self) -> bool:
        try:
            return bool(self.store.raw.ping())
        except Exception:
            return False

    def _work_once(
        self, k: int, burst: bool, max_jobs: int | None
    ) -> tuple[NodeRQWorker | None, bool, bool]:
        """One RQ loop: (the RQ worker, whether it ran jobs, whether the worker is done)."""
        rq: NodeRQWorker | None = None
        try:
            # A new RQ name after the first round: the old one may still be registered (a
            # Redis restart with AOF keeps it). Building the worker talks to Redis too.
            rq = self.rq_worker(self.name if k == 0 else f"{self.name}-r{k}")
            self.register()
            worked = bool(rq.work(burst=burst, max_jobs=max_jobs, logging_level="WARNING"))
        except Exception as exc:
            log.warning("worker loop failed (%s); retrying", exc)
            return rq, False, False
        done = _stop_asked(rq) or ((burst or max_jobs is not None) and self._redis_up())
        return rq, worked, bool(done)

    def work(self, burst: bool = False, max_jobs: int | None = None) -> bool:
        """Pull the node's queue; every placed job runs at once, each under its own supervisor.

        ``run_job`` only starts a job and returns, so one RQ loop on the one queue (its safe
        BLMOVE path) feeds all of the node's GPUs. On a warm stop (SIGTERM) or in burst mode
        the worker waits for the jobs it runs: their leases stay renewed until they end.
        """
        self.ctx.concurrent = self.concurrent
        set_context(self.ctx)
        if self.ctx.mig is not None:
            self.ctx.mig.clear_leftovers()
        self.refused = self.refusals()
        self.register()
        beat = threading.Thread(target=self._beat, name="snugfit-node-beat", daemon=True)
        beat.start()
        if self.refused and not self._wait_until_fixed(burst):
            return False
        worked = False
        try:
            for k in itertools.count():
                # RQ's loop quits on any Redis error outside its dequeue (heartbeat,
                # maintenance, registration); this one never does.
                rq, got, done = self._work_once(k, burst, max_jobs)
                worked |= got
                if done:
                    return worked
                delay = min(_MAX_BACKOFF_S, 0.1 * 2 ** min(k, 10))
                log.warning("Redis unreachable or RQ loop ended; retrying in %.1f s", delay)
                end = time.monotonic() + delay
                while time.monotonic() < end and not _stop_asked(rq):
                    time.sleep(0.05)
                if _stop_asked(rq):  # SIGTERM in the backoff (RQ's handler saw it)
                    return worked
            return worked
        finally:
            self.ctx.join_running()
            self._stop.set()
            if self.ctx.mps is not None:
                self.ctx.mps.stop()
