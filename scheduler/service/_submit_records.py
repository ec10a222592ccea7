"""The job records a submit writes (``scheduler.service.store.keys`` layout), each run of
jobs that differ only in their id encoded once.

A batch submit is usually a sweep: one spec under many ids, or many specs the predictor reads
alike, with one prediction row repeated. Building every job's ``spec``, ``request`` and
``predictions`` JSON from scratch (a dict per GPU row, three encodes) was the largest part of
the client's CPU in ``benchmarks/bench_service.py --only throughput``. Two levels of runs:
consecutive jobs whose prediction rows are the same bytes (and method) share their
``predictions`` but for the id; those whose spec values are also the same objects share their
``spec`` but for the id, and their ``request``. Each is encoded once, for the run's first job
with a placeholder id, and split at the placeholder; every job of the run joins the pieces
with its own id encoded. JSON encoding is compositional (an object's text is its members'
texts in order), so the joined text is byte for byte the text the job would have been
encoded to. A run whose text holds the placeholder elsewhere, or that the fast encoder
refuses, is encoded job by job as before.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from predictor.gpus import GPU_NAMES
from predictor.prediction import PredictionTable
from predictor.spec import JobSpec
from scheduler.core.engines import engine_upper_gib
from scheduler.core.requests import gradient_syncs, host_floor_gib
from scheduler.core.rules import MAX_OOM_RETRIES, MAX_RETRIES
from scheduler.service.store.records import dumps

if TYPE_CHECKING:
    from predictor.internode import GradientSync

__all__ = ["build_records"]

#: The id a run's template is encoded with; control characters make it impossible in a real id
#: and unlikely anywhere else (where it is found, the run is encoded job by job).
_PLACEHOLDER = "\x00snugfit:job-id\x00"
_PLACEHOLDER_JSON = orjson.dumps(_PLACEHOLDER).decode()
_OPT = orjson.OPT_SERIALIZE_NUMPY


def build_records(
    specs: Sequence[JobSpec],
    table: PredictionTable,
    *,
    now: float | None = None,
    max_retries: int = MAX_RETRIES,
    max_oom_retries: int = MAX_OOM_RETRIES,
    hold: bool = False,
) -> list[dict[str, str]]:
    """Job records for specs that all carry an id, one per row of ``table``.
    ``hold``: every job is submitted held (placed only after ``release``)."""
    if len(table) != len(specs):
        raise ValueError(f"{len(specs)} specs but a prediction table of {len(table)} jobs")
    t = time.time() if now is None else now
    same_row = _same_as_previous_row(table)
    # Two levels of runs: the predictions need only the rows to repeat (a sweep over commands
    # or settings the predictor does not read), the spec and request need the spec to as well.
    row_starts = [i for i in range(len(specs)) if not same_row[i]]
    starts = [
        i for i in range(len(specs)) if not (same_row[i] and _same_but_id(specs[i - 1], specs[i]))
    ]
    preds = _prediction_templates(_rows(table, row_starts))
    runs = _spec_templates([specs[i] for i in starts], _rows(table, starts), hold)
    tail = {
        "attempt": "0",
        "max_retries": str(max_retries),
        "max_oom_retries": str(max_oom_retries),
    }
    out: list[dict[str, str]] = []
    run, row_run = -1, -1
    spec_parts: list[str] | _Slow = []
    pred_parts: list[str] | _Slow = []
    request = ""
    workflow: dict[str, str] = {}
    for i, spec in enumerate(specs):
        if not same_row[i]:
            row_run += 1
            pred_parts = preds[row_run]
        if run + 1 < len(starts) and starts[run + 1] == i:
            run += 1
            spec_parts, request, workflow = runs[run]
        assert spec.id is not None
        ts = repr(t + i * 1e-6)  # keeps submit order inside one batch
        rec = {
            "id": spec.id,
            "submitted_at": ts,
            "updated_at": ts,
            "spec": _join(spec_parts, spec.id),
            "request": request,
            "predictions": _join(pred_parts, table.job_ids[i]),
            "method": table.method[i],
            **tail,
        }
        rec.update(workflow)
        out.append(rec)
    return out


def _rows(table: PredictionTable, rows: list[int]) -> PredictionTable:
    """``table``'s ``rows`` (the templates do not read their ids); the table itself when every
    row is wanted (no run repeats: a one-job submit), so no array is copied."""
    if len(rows) == len(table):
        return table
    return table.take(np.asarray(rows, np.intp), (None,) * len(rows))


class _Slow:
    """A run encoded job by job: its first job's value with each job's id put in (``rows``:
    the value is per-GPU prediction rows, each holding the id)."""

    __slots__ = ("rows", "value")

    def __init__(self, value: dict[str, Any], *, rows: bool) -> None:
        self.value = value
        self.rows = rows


def _join(parts: list[str] | _Slow, job_id: str | None) -> str:
    if isinstance(parts, _Slow):
        v = parts.value
        if parts.rows:
            return dumps({g: {**row, "id": job_id} for g, row in v.items()})
        return dumps({**v, "id": job_id})  # an existing key: the id keeps its position
    return orjson.dumps(job_id).decode().join(parts)


def _template(obj: Any, holes: int) -> list[str] | None:
    """``obj``'s JSON split at the placeholder, when it holds exactly ``holes`` of them and
    the fast encoder (what :func:`dumps` tries first) takes it."""
    try:
        parts = orjson.dumps(obj, option=_OPT).decode().split(_PLACEHOLDER_JSON)
    except TypeError:
        return None
    return parts if len(parts) == holes + 1 else None


def _prediction_templates(sub: PredictionTable) -> list[list[str] | _Slow]:
    """Per run of repeated rows, its ``predictions`` template (``sub``: the runs' first rows)."""
    n_types = len(sub.gpu_names)
    per_job: list[dict[str, Any]] = [{} for _ in range(len(sub))]
    for k, row in enumerate(sub.iter_dicts()):
        row["id"] = _PLACEHOLDER  # in place: the id keeps its position
        per_job[k // n_types][row["gpu"]] = row
    return [_template(p, len(p)) or _Slow(p, rows=True) for p in per_job]


def _spec_templates(
    reps: Sequence[JobSpec], sub: PredictionTable, hold: bool
) -> list[tuple[list[str] | _Slow, str, dict[str, str]]]:
    """Per run of jobs the same but for their id, from its first job (``sub``: their rows):
    the spec template, the request JSON and the workflow fields."""
    cols = [sub.gpu_names.index(g) if g in sub.gpu_names else -1 for g in GPU_NAMES]
    arrays = [sub.peak_vram_gib, sub.peak_vram_upper_gib, sub.runtime_s]
    arrays += [sub.runtime_upper_s] + ([] if sub.busy_frac is None else [sub.busy_frac])
    vram, upper, runtime, runtime_up, *rest = _catalogue_columns(arrays, cols)
    busy = rest[0] if rest else None
    # Per run, not per job: both are elementwise in the spec's values (+ - * /, no ufunc whose
    # vector and scalar paths may round apart), so a run's jobs share their first job's figures.
    host_floor = host_floor_gib(reps)
    syncs = gradient_syncs(reps)
    out: list[tuple[list[str] | _Slow, str, dict[str, str]]] = []
    for i, spec in enumerate(reps):
        request: dict[str, Any] = {
            "vram_gib": vram[i],
            # An engine that cannot be told its reservation takes its default share of the GPU.
            "vram_upper_gib": engine_upper_gib(spec.framework, spec.command, spec.env, upper[i]),
            "runtime_s": runtime[i],
            "runtime_upper_s": runtime_up[i],
            "busy_frac": None if busy is None else busy[i],
            "n_gpus": spec.n_gpus,
            "tensor_parallel": spec.tensor_parallel,
            "pipeline_parallel": spec.pipeline_parallel,
            "gpu": spec.gpu,
            "priority": spec.priority,
            "deadline_s": spec.deadline_s,
            "cpus": spec.cpus,
            "host_memory_gib": spec.host_memory_gib,
            "host_memory_floor_gib": round(host_floor[i], 3),
        }
        if spec.node_selector:
            request["node_selector"] = {k: list(v) for k, v in spec.node_selector.items()}
        if syncs[i].steps > 0:
            request["sync"] = _sync_figures(syncs[i])
        spec_dict = spec.to_dict()
        spec_dict["id"] = _PLACEHOLDER  # in place: the id keeps its position
        spec_parts = _template(spec_dict, 1) or _Slow(spec_dict, rows=False)
        out.append((spec_parts, dumps(request), _workflow_fields(spec, hold)))
    return out


def _same_as_previous_row(table: PredictionTable) -> np.ndarray:
    """Per job, whether its method and every prediction array's row are those of the job
    before it (byte for byte: equal bytes encode to equal text)."""
    n = len(table)
    same = np.zeros(n, bool)
    if n < 2:
        return same
    method = np.array(table.method, dtype=object)
    same[1:] = method[1:] == method[:-1]
    for a in table.row_arrays():
        if a.dtype.hasobject or a.shape[:1] != (n,):
            same[1:] = False
            break
        b = np.ascontiguousarray(a).view(np.uint8).reshape(n, -1)
        same[1:] &= (b[1:] == b[:-1]).all(axis=1)
    return same


def _same_but_id(a: JobSpec, b: JobSpec) -> bool:
    """Whether ``b`` holds ``a``'s very values (the same objects) in every field but ``id``,
    with the same fields set: what a sweep's specs share (``predictor._spec_sweep``)."""
    if type(a) is not type(b) or a.__pydantic_fields_set__ != b.__pydantic_fields_set__:
        return False
    da, db = a.__dict__, b.__dict__
    if len(da) != len(db):
        return False
    same = list(map(operator.is_, da.values(), db.values()))
    if all(same):
        return True
    k = same.index(False)
    return all(same[k + 1 :]) and list(da)[k] == "id" and list(db)[k] == "id"


def _catalogue_columns(
    arrays: Sequence[np.ndarray], cols: Sequence[int]
) -> list[list[list[float | None]]]:
    """Each of ``arrays`` (jobs, the table's GPU types) as one list per job over the whole
    catalogue, in one vectorised pass for them all: types the table lacks and inf/NaN become
    null."""
    n = arrays[0].shape[0]
    full = np.full((len(arrays), n, len(cols)), np.nan)
    have = [k for k, c in enumerate(cols) if c >= 0]
    if have:
        full[:, :, have] = np.array(arrays, dtype=np.float64)[:, :, [cols[k] for k in have]]
    out: list[list[list[float | None]]] = full.tolist()
    if not np.isfinite(full).all():
        out = [[[x if math.isfinite(x) else None for x in r] for r in a] for a in out]  # type: ignore[arg-type]
    return out


def _sync_figures(g: GradientSync) -> list[float | None]:
    """The request's ``sync`` list: what a multi-node placement needs to price its traffic."""
    return [
        g.steps,
        g.grad_bytes_per_gpu,
        g.data_parallel,
        g.charged_s,
        g.activation_bytes,
        g.micro_batches,
    ]


def _workflow_fields(spec: JobSpec, hold: bool) -> dict[str, str]:
    """Identity and workflow fields, plain hash fields so filters read them with HMGET."""
    rec: dict[str, str] = {}
    if spec.user is not None:
        rec["user"] = spec.user
    if spec.team is not None:
        rec["team"] = spec.team
    if spec.depends_on:
        rec["deps"] = dumps(list(spec.depends_on))
    if hold:
        rec["hold"] = "1"
    return rec
