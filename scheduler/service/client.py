"""The Python client: submit jobs, watch them, cancel them, read their logs.

``Client.submit`` validates the spec (pydantic, :func:`predictor.spec.parse_spec`), waits up to
a budget for the job's CPU trace (the traced tier), predicts peak VRAM and runtime on every GPU
type, and writes the job record in one Lua call that is a no-op when the id already exists
(submitting the same ``id`` twice is one job). The scheduler service does the rest; a
:class:`JobHandle` reads the record back.

Records read from Redis are validated too: a handle on a record someone corrupted raises
:class:`~scheduler.exceptions.ServiceError` naming the field, never a bare ``KeyError``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from predictor._spec_sweep import SweepParser
from predictor.prediction import Prediction, PredictionTable
from predictor.spec import JobSpec, Task, load_specs, parse_spec
from predictor.traced import SUBMIT_BUDGET_S
from scheduler.core.decision import Decision
from scheduler.core.rules import MAX_OOM_RETRIES, MAX_RETRIES
from scheduler.exceptions import JobFailedError, JobNotFoundError, SchedulerError, ServiceError
from scheduler.service._submit_records import build_records
from scheduler.service._workflow import check_parents_exist, default_user, order_by_dependencies
from scheduler.service.store.keys import TERMINAL_STATES, JobState
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import OutcomeRecord, PlacementRecord, dumps
from scheduler.service.store.redis_store import RedisStore, open_store

if TYPE_CHECKING:
    from scheduler.service.deployments import Deployments

# build_records: workers/_outcome.py builds an OOM retry's record with it from here.
__all__ = [
    "DEFAULT_MAX_OOM_RETRIES",
    "DEFAULT_MAX_RETRIES",
    "TRACE_BUDGET_ENV",
    "Client",
    "JobHandle",
    "build_records",
]

log = logging.getLogger("snugfit.client")

# The shared rules' caps (scheduler.core.rules), so the simulator gives up where the store does.
DEFAULT_MAX_RETRIES = MAX_RETRIES
DEFAULT_MAX_OOM_RETRIES = MAX_OOM_RETRIES
_WAIT_POLL_S = 0.05
_SUBMIT_CHUNK = 2000
#: The submit path's default wait for traces, in seconds, when the client is not told one.
TRACE_BUDGET_ENV = "SNUGFIT_TRACE_BUDGET_S"

SpecLike = JobSpec | Mapping[str, Any] | str | Path
TableFn = Callable[[Sequence[JobSpec]], PredictionTable]


def default_table_fn(trace_budget_s: float = 0.0) -> TableFn:
    """The tiered predictor (the active learned artifact + calibrated bounds, falling back to
    the analytical tier by itself): the one predictor the CLI, the service and the simulator
    share. It follows the active artifact, so a retrain is picked up by the next submit.

    ``trace_budget_s`` > 0 (the client's submit path): first wait up to that long in all for
    the jobs' traces (:func:`predictor.traced.wait_for_traces`), so a traceable job is placed
    on its traced peak. A cache hit, an excluded framework or a machine without the
    ``[trace]`` extra costs no wait; a trace still running at the budget finishes in the
    background and its job is predicted analytically this time."""
    from predictor.tiered import default_predictor

    pred = default_predictor()
    wait = _trace_wait(trace_budget_s)

    def table(specs: Sequence[JobSpec]) -> PredictionTable:
        if wait is not None:
            wait(specs)
        pred.refresh()  # a stat per call: a long-lived client follows the leader's retraining
        return pred.predict_table(specs, None)

    return table


def _trace_wait(budget_s: float) -> Callable[[Sequence[JobSpec]], object] | None:
    """The submit path's wait for traces, or None when there is nothing to wait for."""
    if budget_s <= 0:
        return None
    from predictor.traced import is_available, wait_for_traces

    if not is_available():
        return None

    def wait(specs: Sequence[JobSpec]) -> object:
        pending = [o.id for o in wait_for_traces(specs, budget_s) if o.status == "pending"]
        if pending:
            log.info(
                "%d job(s) predicted analytically: their trace was not done within %g s "
                "(it lands in the trace cache for their next submit): %s",
                len(pending),
                budget_s,
                ", ".join(str(j) for j in pending[:5]),
            )
        return pending

    return wait


def _trace_budget(value: float | str | None) -> float:
    """``trace_budget_s`` as given, else ``$SNUGFIT_TRACE_BUDGET_S``, else
    :data:`~predictor.traced.SUBMIT_BUDGET_S`; a negative or non-numeric value is refused."""
    name = "trace_budget_s"
    if value is None:
        value = os.environ.get(TRACE_BUDGET_ENV)
        name = f"${TRACE_BUDGET_ENV}"
    if value is None:
        return SUBMIT_BUDGET_S
    try:
        budget = float(value)
    except (TypeError, ValueError):
        budget = math.nan
    if not budget >= 0:  # NaN fails too
        raise ServiceError(
            f"`{name}` must be a number of seconds >= 0; got {value!r} "
            "(0 predicts without waiting for traces)"
        )
    return budget


def _as_specs(spec: SpecLike) -> list[JobSpec]:
    if isinstance(spec, JobSpec):
        return [spec]
    if isinstance(spec, str | Path):
        specs = load_specs(spec)
        if not specs:
            raise ServiceError(f"{spec}: holds no jobs; write one JobSpec per line (JSONL), or a "
                               "JSON/YAML object or list")  # fmt: skip
        return specs
    if isinstance(spec, Mapping):
        return [parse_spec(spec)]
    raise ServiceError(
        f"submit() takes a JobSpec, a dict or a path to a job file; got {type(spec).__name__}"
    )


class Client:
    """Submit and inspect jobs. ``url`` / ``SNUGFIT_REDIS_URL`` / embedded Redis, or a store.

    ``trace_budget_s``: how long a submit waits in all for its jobs' CPU traces before it
    predicts with the default predictor (``$SNUGFIT_TRACE_BUDGET_S``, else 15 s; 0 never
    waits). A job is traced once; later submits of the same shape answer from the cache."""

    def __init__(
        self,
        url: str | None = None,
        *,
        store: Store | None = None,
        table_fn: TableFn | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
        trace_budget_s: float | None = None,
    ) -> None:
        self.store: Store = store if store is not None else open_store(url)
        self._table_fn = table_fn
        # How long a submit waits for its jobs' traces (the default predictor only).
        self.trace_budget_s = _trace_budget(trace_budget_s)
        self.max_retries = max_retries
        self.max_oom_retries = max_oom_retries

    @property
    def table_fn(self) -> TableFn:
        if self._table_fn is None:
            self._table_fn = default_table_fn(self.trace_budget_s)
        return self._table_fn

    # -- submission ---------------------------------------------------------------------------

    @property
    def deployments(self) -> Deployments:
        """Serving deployments (``task: serve`` specs) on this store."""
        from scheduler.service.deployments import Deployments

        return Deployments(self.store)

    def submit(self, spec: SpecLike) -> JobHandle:
        """Validate, predict and store one job; returns its handle (the existing job's handle
        when the id was already submitted)."""
        specs = _as_specs(spec)
        if len(specs) != 1:
            raise ServiceError(
                f"{spec!s:.80} holds {len(specs)} jobs; submit() takes one, use submit_many()"
            )
        return self.submit_many(specs)[0]

    def submit_many(self, specs: Iterable[SpecLike], *, hold: bool = False) -> list[JobHandle]:
        """Submit many jobs with one vectorised prediction and pipelined writes. A ``serve``
        spec becomes a deployment (planned now, its replicas queued); its handle is a
        :class:`~scheduler.service.deployments.DeploymentHandle`.

        ``user`` defaults to the submitting OS user. Jobs are written parents first, so a batch
        may hold a whole dependency graph; a ``depends_on`` id that is neither in the batch
        nor already submitted raises :class:`UnknownDependencyError` before anything is
        written. ``hold``: submit every job held (``release`` lets it run)."""
        user = default_user()
        # Dicts through one parser: a sweep (specs that differ only in id) is validated once.
        sweep = SweepParser(fill={"user": user})
        parsed: list[JobSpec] = []
        for s in specs:
            if isinstance(s, Mapping):
                parsed.append(sweep.parse(s))
            else:
                parsed.extend(_as_specs(s))
        parsed = [s if s.user is not None else s.model_copy(update={"user": user}) for s in parsed]
        if any(s.task is Task.SERVE for s in parsed):
            return self._submit_mixed(parsed)
        for k, s in enumerate(parsed):
            if s.id is None:
                parsed[k] = s.model_copy(update={"id": uuid.uuid4().hex[:16]})
        ordered = order_by_dependencies(parsed)
        check_parents_exist(self.store, ordered)
        for start in range(0, len(ordered), _SUBMIT_CHUNK):
            chunk = ordered[start : start + _SUBMIT_CHUNK]
            table = self.table_fn(chunk)
            records = build_records(
                chunk,
                table,
                max_retries=self.max_retries,
                max_oom_retries=self.max_oom_retries,
                hold=hold,
            )
            # New ids (the usual case): one round trip, the resubmit check included.
            added, stored = self.store.add_new_jobs(records)
            if added is None:
                self._check_resubmits(chunk, stored)
                added = self.store.add_jobs(records)
            for spec, new in zip(chunk, added, strict=True):
                if not new:
                    log.info("job %s was already submitted; returning the existing job", spec.id)
        return [JobHandle(self, str(s.id)) for s in parsed]

    def submit_array(
        self,
        spec: JobSpec | Mapping[str, Any] | str | Path,
        indices: str | Sequence[int],
        *,
        chain: bool = False,
        hold: bool = False,
    ) -> list[JobHandle]:
        """Submit ``spec`` once per index (Slurm's ``--array``; ``indices`` as ``"0-99"``,
        ``"0-9:2"``, ``"1,3,5"`` or a list). ``{index}`` in ``id``, ``command``, ``env``,
        ``workdir`` and ``depends_on`` becomes the index; an ``id`` without it gets
        ``-{index}`` (:func:`predictor.spec.expand_array`). ``chain``: each element also
        depends on the one before it. Returns the elements' handles in index order."""
        from predictor.spec import expand_array, parse_array

        base = _as_specs(spec) if not isinstance(spec, Mapping) else [parse_spec(spec)]
        if len(base) != 1:
            raise ServiceError(f"an array expands one job spec; {spec!s:.80} holds {len(base)}")
        idx = parse_array(indices) if isinstance(indices, str) else list(indices)
        raw = base[0].model_dump(mode="json", exclude_unset=True)
        return self.submit_many(expand_array(raw, idx, chain=chain), hold=hold)

    def _submit_mixed(self, parsed: list[JobSpec]) -> list[Any]:
        from scheduler.service.deployments import DeploymentHandle

        deps = self.deployments
        out: list[Any] = []
        for s in parsed:
            if s.task is Task.SERVE:
                out.append(DeploymentHandle(deps, deps.create(s)))
            else:
                out.extend(self.submit_many([s]))
        return out

    def _check_resubmits(self, chunk: Sequence[JobSpec], stored: Sequence[str | None]) -> None:
        """Resubmitting an id is idempotent only for the same spec: a different one under an
        existing id would be silently dropped, so it is an error naming the id. ``stored``:
        per spec, the existing record's submitted spec (None for a new id)."""
        # An OOM retry may have re-split the job (``spec`` at a higher tensor_parallel); what
        # was submitted is then ``submitted_spec`` (the store answers that one first).
        clash = []
        for spec, raw in zip(chunk, stored, strict=True):
            if raw is None:
                continue
            try:
                same = json.loads(raw) == json.loads(dumps(spec.to_dict()))
            except ValueError:
                same = False
            if not same:
                clash.append(str(spec.id))
        if clash:
            shown = ", ".join(repr(c) for c in clash[:5]) + (" ..." if len(clash) > 5 else "")
            raise ServiceError(
                f"job id {shown} already exists with a different spec; resubmitting an id is "
                "only a no-op for the identical spec. Use a new `id` (or none, for a fresh one)"
            )

    # -- queries ------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobHandle:
        if self.store.get_fields([job_id], ["state"])[0][0] is None:
            if self.deployments.exists(job_id):
                raise JobNotFoundError(
                    f"{job_id!r} is a serving deployment, not a job; see `snugfit serve status "
                    f"{job_id}` (its replicas are jobs {job_id}-r0, ...)"
                )
            raise JobNotFoundError(f"no job with id {job_id!r}; list jobs with `snugfit status`")
        return JobHandle(self, job_id)

    def jobs(self, state: str | None = None) -> list[JobHandle]:
        """Handles of every job, oldest first, or of those in one state."""
        if state is not None and state not in JobState.__members__.values():
            raise ServiceError(
                f"unknown job state {state!r}; use one of {', '.join(s.value for s in JobState)}"
            )
        return [JobHandle(self, j) for j in self.store.job_ids(state)]

    def counts(self) -> dict[str, int]:
        return {s.value: self.store.count(s.value) for s in JobState}

    def cancel(self, job_id: str) -> str:
        """Cancel a job, or a whole deployment (every replica)."""
        if self.deployments.exists(job_id):
            return self.deployments.cancel(job_id)
        return self.get(job_id).cancel()

    # -- holds, requeue, queue, accounting ------------------------------------------------------

    def hold(self, job_ids: str | Sequence[str]) -> dict[str, str]:
        """Keep pending jobs from being placed (Slurm's ``scontrol hold``): per id ``held``,
        ``already held``, ``missing`` or the state that cannot be held."""
        return self._each(job_ids, self.store.hold)

    def release(self, job_ids: str | Sequence[str]) -> dict[str, str]:
        """Lift holds: per id ``released``, ``not held`` or ``missing``. A released job still
        waits for parents that have not succeeded."""
        return self._each(job_ids, self.store.release)

    def requeue(self, job_ids: str | Sequence[str]) -> dict[str, str]:
        """Back to pending as a new attempt (``scontrol requeue``): per id ``requeued``,
        ``requested`` (running: its worker stops it first), ``pending`` (nothing to do),
        ``missing`` or ``parent:<id>:<state>`` (a parent failed; requeue it first)."""
        return self._each(job_ids, self.store.user_requeue)

    def _each(self, job_ids: str | Sequence[str], fn: Callable[[str], str]) -> dict[str, str]:
        ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
        return {j: fn(j) for j in ids}

    def queue(self, **filters: Any) -> list[Any]:
        """``squeue``: :class:`~scheduler.service.queue.QueueRow` per job; filters
        ``job_ids``, ``states``, ``users``, ``teams``, ``nodes`` (active jobs by default)."""
        from scheduler.service.queue import queue_rows

        return queue_rows(self.store, **filters)

    def acct(
        self,
        *,
        since: str | float | None = None,
        until: str | float | None = None,
        by: str | None = None,
        **filters: Any,
    ) -> dict[str, Any]:
        """``sacct``: cost, GPU-hours, reserved vs used VRAM and predicted vs actual per job,
        or summed ``by`` user or team, for attempts that ended in ``[since, until)`` (ISO
        times, epoch seconds, or ``2h`` / ``1d`` ago). See :mod:`scheduler.service.accounting`."""
        from scheduler.service.accounting import accounting, parse_when

        now = time.time()
        return accounting(
            self.store,
            since=parse_when(since, now),
            until=parse_when(until, now),
            by=by,
            **filters,
        )

    def pool(self) -> dict[str, Any]:
        """Pool occupancy: per GPU (node, type, mode, capacity and used MiB, MIG mask, shared
        jobs) and per job (what it holds). Empty ``gpus`` before a scheduler has started."""
        config = self.store.pool_config()
        if config is None:
            return {"name": None, "nodes": [], "gpus": [], "jobs": {}}
        from scheduler.core.pool import Pool

        pool = Pool.from_dict(config)
        g = self.store.gpu_state()
        gpus = []
        for i in range(pool.n_gpus):
            node = pool.nodes[int(pool.gpu_node[i])]
            gpus.append(
                {
                    "index": i,
                    "node": node.name,
                    "gpu_type": node.gpu_type,
                    "mode": node.mode,
                    "capacity_mib": g.get(f"{i}:cap", int(pool.capacity_mib[i])),
                    "used_mib": g.get(f"{i}:used", 0),
                    "mig_mask": g.get(f"{i}:mig", 0),
                    "shared_jobs": g.get(f"{i}:shared", 0),
                }
            )
        jobs = {}
        for jid, raw in self.store.allocations().items():
            try:
                a = json.loads(raw)
                jobs[jid] = {"gpus": a["gpus"], "label": _label(a["option"])}
            except (ValueError, KeyError, TypeError):
                jobs[jid] = {"gpus": [], "label": "unreadable allocation"}
        return {"name": pool.name, "nodes": config["nodes"], "gpus": gpus, "jobs": jobs}

    def close(self) -> None:
        if isinstance(self.store, RedisStore):
            self.store.close()


def _label(option: Mapping[str, Any]) -> str:
    if option.get("kind") == "mig":
        return f"{option.get('gpu_type')} MIG {option.get('mig_profile')}"
    if option.get("kind") == "shared":
        return f"{option.get('gpu_type')} shared"
    return f"{option.get('gpu_type')} x{option.get('n_gpus')}"


class JobHandle:
    """A submitted job. Every property reads the record fresh from the store."""

    __slots__ = ("_client", "id")

    def __init__(self, client: Client, job_id: str) -> None:
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def record(self) -> dict[str, str]:
        rec = self._client.store.get_job(self.id)
        if rec is None:
            raise JobNotFoundError(f"no job with id {self.id!r}")
        return rec

    def status(self) -> str:
        st = self._client.store.get_fields([self.id], ["state"])[0][0]
        if st is None:
            raise JobNotFoundError(f"no job with id {self.id!r}")
        return st

    @property
    def reason(self) -> str:
        return self.record().get("reason", "")

    @property
    def spec(self) -> JobSpec:
        return parse_spec(self._json("spec") or {})

    @property
    def placement(self) -> PlacementRecord | None:
        raw = self._json("placement")
        return None if raw is None else _validate(PlacementRecord, raw, self.id, "placement")

    @property
    def prediction(self) -> dict[str, Prediction]:
        raw = self._json("predictions") or {}
        return {g: _validate(Prediction, p, self.id, "predictions") for g, p in raw.items()}

    @property
    def outcome(self) -> OutcomeRecord | None:
        raw = self._json("outcome")
        return None if raw is None else _validate(OutcomeRecord, raw, self.id, "outcome")

    @property
    def decision(self) -> dict[str, Any] | None:
        """The latest Decision as a dict with every option spelled out (the record stores it
        in the compact columnar form)."""
        raw = self._json("decision")
        if not isinstance(raw, dict) or "option_columns" not in raw:
            return raw  # type: ignore[no-any-return]
        try:
            return Decision.from_dict(raw).to_dict()
        except SchedulerError as exc:
            raise ServiceError(f"job {self.id!r}: unreadable decision record: {exc}") from None

    def _json(self, name: str) -> Any:
        raw = self.record().get(name)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ServiceError(
                f"job {self.id!r}: field {name!r} is not valid JSON ({raw[:60]!r}); the record "
                "was written by something other than snugfit"
            ) from None

    def wait(self, timeout: float | None = None, poll_s: float = _WAIT_POLL_S) -> str:
        """Block until the job ends; returns ``succeeded``. Raises :class:`JobFailedError`
        (failed, rejected, cancelled) with the reason, or ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if st in TERMINAL_STATES:
                if st == JobState.SUCCEEDED:
                    return st
                raise JobFailedError(f"job {self.id!r} {st}: {self.reason or 'no reason given'}")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id!r} still {st} after {timeout} s")
            time.sleep(poll_s)

    def cancel(self) -> str:
        """Cancel: a pending/placed job at once, a running one is stopped by its worker.
        Returns ``cancelled``, ``requested`` (running; the worker stops it) or the final state
        it already had."""
        got = self._client.store.cancel(self.id, "cancelled by user")
        if got == "missing":
            raise JobNotFoundError(f"no job with id {self.id!r}")
        if got == "cancelled":
            self._client.store.emit(
                [{"ts": time.time(), "event": "cancelled", "job_id": self.id, "reason": "user"}]
            )
        return got

    def logs(self) -> str:
        """The captured stdout+stderr tail (simulated runs log a synthetic line per phase)."""
        return self._client.store.logs(self.id)


def _validate(model: Any, data: Any, job_id: str, name: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ServiceError(
            f"job {job_id!r}: field {name!r} does not match its schema ({exc.error_count()} "
            f"errors, first: {exc.errors()[0]['msg']})"
        ) from None
