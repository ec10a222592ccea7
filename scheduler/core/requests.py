"""What a job asks of the placer: :class:`PlacementRequest`, :class:`RunningJob`, and the one
definition of the whole GPU type a user would request (the ``requested`` baseline, live and
simulated alike).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from predictor.gpus import GPU_NAMES
from predictor.internode import GradientSync
from predictor.limits import MAX_CPUS, MAX_HOST_MEMORY_GIB
from scheduler.core._classes import node_max_size
from scheduler.core.decision import Option
from scheduler.core.host import HostAsk
from scheduler.core.pool import Pool
from scheduler.core.selector import NodeSelector, node_selector
from scheduler.exceptions import PlacementError

if TYPE_CHECKING:
    from predictor.prediction import PredictionTable
    from predictor.spec import JobSpec

__all__ = [
    "HABITUAL_GPU",
    "N_TYPES",
    "TYPE_INDEX",
    "PlacementRequest",
    "RunningJob",
    "host_floor_gib",
    "probe_request",
    "requested_type",
    "requested_types",
    "requests_from_table",
]


N_TYPES = len(GPU_NAMES)


TYPE_INDEX = {n: i for i, n in enumerate(GPU_NAMES)}


# The GPU a user asks for today when nothing else is known: an H100 if the job fits one.
HABITUAL_GPU = "H100-80GB"


def _type_vector(values: Any, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (N_TYPES,):
        raise PlacementError(
            f"{name} must have one value per GPU type {GPU_NAMES} (shape ({N_TYPES},)); "
            f"got shape {a.shape}"
        )
    return a


#: The clip ufunc (what np.clip calls for an array, past its dispatch).
_clip = np._core.umath.clip  # type: ignore[attr-defined]


@dataclass(slots=True, init=False)
class PlacementRequest:
    """One job as the placer sees it. Per-type arrays are aligned with ``GPU_NAMES``.

    ``vram_*`` are per GPU in GiB, ``runtime_*`` seconds for the whole job; ``inf``/``nan``
    marks a type the predictor cannot place the job on. ``reserved_gib`` is the floor set after
    an OOM: the reservation is ``max(vram_upper_gib[type], reserved_gib)``. ``deadline_s`` is
    relative to ``submit_time_s``. ``cpus`` and ``host_memory_gib`` are the job's own host
    figures on its node (None: the node's share of the slot, :mod:`scheduler.core.host`);
    ``host_memory_floor_gib`` is the predictor's host memory estimate, which raises that share.
    ``node_selector`` keeps the job to nodes whose labels match: per label key, the accepted
    values (:mod:`scheduler.core.selector`; given as a mapping, kept in canonical form).
    """

    job_id: str
    vram_gib: np.ndarray
    vram_upper_gib: np.ndarray
    runtime_s: np.ndarray
    runtime_upper_s: np.ndarray
    n_gpus: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    gpu: str | None = None
    requested_gpu: str = HABITUAL_GPU
    priority: int = 0
    deadline_s: float | None = None
    submit_time_s: float = 0.0
    user_runtime_estimate_s: float | None = None
    reserved_gib: float | None = None
    busy_frac: np.ndarray = field(default_factory=lambda: np.ones(N_TYPES))
    cpus: float | None = None
    host_memory_gib: float | None = None
    host_memory_floor_gib: float = 0.0
    #: Data-parallel gradient traffic (predictor.internode): what a multi-node gang's runtime
    #: is priced with; zero for inference and single-GPU jobs.
    sync: GradientSync = field(default_factory=GradientSync)
    node_selector: NodeSelector | None = None
    # The three figures above in whole millicores / MiB, computed once (placement reads them
    # for the whole queue on every tick).
    host_ask: HostAsk = field(init=False, repr=False, compare=False)

    # Hand-written so callers may pass lists or any array-like per-type figures while the
    # attributes stay float64 arrays (dataclasses.replace still works: same parameter names).
    def __init__(
        self,
        job_id: str,
        vram_gib: npt.ArrayLike,
        vram_upper_gib: npt.ArrayLike,
        runtime_s: npt.ArrayLike,
        runtime_upper_s: npt.ArrayLike,
        n_gpus: int = 1,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        gpu: str | None = None,
        requested_gpu: str = HABITUAL_GPU,
        priority: int = 0,
        deadline_s: float | None = None,
        submit_time_s: float = 0.0,
        user_runtime_estimate_s: float | None = None,
        reserved_gib: float | None = None,
        busy_frac: npt.ArrayLike | None = None,
        cpus: float | None = None,
        host_memory_gib: float | None = None,
        host_memory_floor_gib: float = 0.0,
        sync: GradientSync | None = None,
        node_selector: Any = None,
    ) -> None:
        self.job_id = job_id
        self.vram_gib = _type_vector(vram_gib, "vram_gib")
        self.vram_upper_gib = _type_vector(vram_upper_gib, "vram_upper_gib")
        self.runtime_s = _type_vector(runtime_s, "runtime_s")
        self.runtime_upper_s = _type_vector(runtime_upper_s, "runtime_upper_s")
        # Unknown (or non-finite) busy fractions count as fully saturating: the safe side.
        busy = np.ones(N_TYPES) if busy_frac is None else _type_vector(busy_frac, "busy_frac")
        # The clip ufunc itself: np.clip's dispatch costs more than the clip (twice per job).
        self.busy_frac = _clip(np.where(np.isfinite(busy), busy, 1.0), 0.0, 1.0)
        self.n_gpus = n_gpus
        self.tensor_parallel = tensor_parallel
        self.pipeline_parallel = pipeline_parallel
        self.gpu = gpu
        self.requested_gpu = requested_gpu
        self.priority = priority
        self.deadline_s = deadline_s
        self.submit_time_s = submit_time_s
        self.user_runtime_estimate_s = user_runtime_estimate_s
        self.reserved_gib = reserved_gib
        self.cpus = cpus
        self.host_memory_gib = host_memory_gib
        self.host_memory_floor_gib = host_memory_floor_gib
        self.sync = GradientSync() if sync is None else sync
        _finish(self, node_selector)

    @property
    def deadline_at_s(self) -> float | None:
        return None if self.deadline_s is None else self.submit_time_s + self.deadline_s

    def reservation_gib(self) -> np.ndarray:
        """Per-type reservation: never below the upper bound, raised by an OOM override."""
        if self.reserved_gib is None:
            return self.vram_upper_gib
        return np.maximum(self.vram_upper_gib, self.reserved_gib)

    def with_figures(
        self,
        vram_gib: np.ndarray,
        vram_upper_gib: np.ndarray,
        runtime_s: np.ndarray,
        runtime_upper_s: np.ndarray,
    ) -> PlacementRequest:
        """A copy with other per-type figures (float64, one per type; a history answer), the
        rest as it is: nothing else needs checking again, so it is copied, not re-built."""
        for name, a in (
            ("vram_gib", vram_gib),
            ("vram_upper_gib", vram_upper_gib),
            ("runtime_s", runtime_s),
            ("runtime_upper_s", runtime_upper_s),
        ):
            if a.shape != (N_TYPES,) or a.dtype != np.float64:
                raise PlacementError(
                    f"{name} must be float64 with one value per GPU type (shape ({N_TYPES},)); "
                    f"got {a.dtype} {a.shape}"
                )
        new = _shallow_copy(self)
        new.vram_gib, new.vram_upper_gib = vram_gib, vram_upper_gib
        new.runtime_s, new.runtime_upper_s = runtime_s, runtime_upper_s
        return new

    def with_identity(self, job_id: str, submit_time_s: float) -> PlacementRequest:
        """A copy under another id and submit time, everything else the same objects (a
        leader decodes a burst of identical records once): the rest was checked already."""
        new = _shallow_copy(self)
        new.job_id, new.submit_time_s = job_id, submit_time_s
        return new

    def with_reservation(self, reserved_gib: float) -> PlacementRequest:
        """A copy whose reservation floor is at least ``reserved_gib`` (after an OOM)."""
        floor = reserved_gib if self.reserved_gib is None else max(self.reserved_gib, reserved_gib)
        return replace(self, reserved_gib=float(floor))

    @classmethod
    def from_table(
        cls,
        spec: JobSpec,
        table: PredictionTable,
        i: int,
        *,
        job_id: str | None = None,
        submit_time_s: float = 0.0,
        requested_gpu: str | None = None,
        user_runtime_estimate_s: float | None = None,
        reserved_gib: float | None = None,
        host_memory_floor_gib: float | None = None,
        sync: GradientSync | None = None,
    ) -> PlacementRequest:
        """Build from a JobSpec and row ``i`` of a PredictionTable (missing types: infeasible).

        ``requested_gpu`` defaults to the spec's pinned ``gpu``, else an H100-80GB when the
        upper bound fits one (today's habit), else the smallest type that holds it.
        ``host_memory_floor_gib`` defaults to the predictor's host memory estimate for the spec
        (pass it when many specs were estimated at once); ``sync`` likewise defaults to
        :func:`gradient_syncs` of the spec.
        """
        arrays = {}
        for name in ("peak_vram_gib", "peak_vram_upper_gib", "runtime_s", "runtime_upper_s"):
            out = np.full(N_TYPES, np.inf)
            col = getattr(table, name)
            for j, g in enumerate(table.gpu_names):
                if g in TYPE_INDEX:
                    out[TYPE_INDEX[g]] = float(col[i, j])
            arrays[name] = out
        busy = np.ones(N_TYPES)
        if table.busy_frac is not None:
            for j, g in enumerate(table.gpu_names):
                if g in TYPE_INDEX:
                    busy[TYPE_INDEX[g]] = float(table.busy_frac[i, j])
        jid = job_id or spec.id or table.job_ids[i]
        if jid is None:
            raise PlacementError(f"row {i}: the job has no id; pass job_id= or set spec.id")
        upper = arrays["peak_vram_upper_gib"]
        if requested_gpu is None:
            requested_gpu = spec.gpu or requested_type(upper, spec.n_gpus)
        return cls(
            job_id=str(jid),
            vram_gib=arrays["peak_vram_gib"],
            vram_upper_gib=upper,
            runtime_s=arrays["runtime_s"],
            runtime_upper_s=arrays["runtime_upper_s"],
            n_gpus=spec.n_gpus,
            tensor_parallel=spec.tensor_parallel,
            pipeline_parallel=spec.pipeline_parallel,
            gpu=spec.gpu,
            requested_gpu=requested_gpu,
            priority=spec.priority,
            deadline_s=spec.deadline_s,
            submit_time_s=submit_time_s,
            user_runtime_estimate_s=user_runtime_estimate_s,
            reserved_gib=reserved_gib,
            busy_frac=busy,
            cpus=spec.cpus,
            host_memory_gib=spec.host_memory_gib,
            host_memory_floor_gib=(
                host_floor_gib([spec])[0]
                if host_memory_floor_gib is None
                else float(host_memory_floor_gib)
            ),
            sync=gradient_syncs([spec])[0] if sync is None else sync,
            node_selector=spec.node_selector,
        )


def requests_from_table(
    specs: Sequence[JobSpec],
    table: PredictionTable,
    *,
    submit_time_s: Sequence[float],
    requested_gpu: Callable[[np.ndarray], Sequence[str]],
    host_memory_floor_gib: Sequence[float],
    sync: Sequence[GradientSync],
) -> list[PlacementRequest]:
    """:meth:`PlacementRequest.from_table` for every row of ``table`` at once (row ``i`` is
    ``specs[i]``): the per-type columns are mapped and checked in one pass instead of per
    job, the figures and checks are the same. ``requested_gpu(upper)`` names every row's
    requested type from the ``(rows, types)`` upper bounds (:func:`requested_types`)."""
    n = len(specs)
    src = [j for j, g in enumerate(table.gpu_names) if g in TYPE_INDEX]
    dst = [TYPE_INDEX[table.gpu_names[j]] for j in src]

    def columns(col: np.ndarray | None, fill: float) -> np.ndarray:
        out = np.full((n, N_TYPES), fill)
        if col is not None and n:
            out[:, dst] = np.asarray(col, np.float64)[:n, src]
        return out

    vram, upper = columns(table.peak_vram_gib, np.inf), columns(table.peak_vram_upper_gib, np.inf)
    runtime, runtime_up = columns(table.runtime_s, np.inf), columns(table.runtime_upper_s, np.inf)
    busy = columns(table.busy_frac, 1.0)
    # PlacementRequest's own busy rule, on every row at once.
    busy = _clip(np.where(np.isfinite(busy), busy, 1.0), 0.0, 1.0)
    wanted = requested_gpu(upper)
    times = np.asarray(submit_time_s, np.float64).tolist()
    floors = np.asarray(host_memory_floor_gib, np.float64).tolist()
    out: list[PlacementRequest] = []
    for i, spec in enumerate(specs):
        jid = spec.id or table.job_ids[i]
        if jid is None:
            raise PlacementError(f"row {i}: the job has no id; set spec.id")
        r = PlacementRequest.__new__(PlacementRequest)
        r.job_id = str(jid)
        r.vram_gib, r.vram_upper_gib = vram[i], upper[i]
        r.runtime_s, r.runtime_upper_s, r.busy_frac = runtime[i], runtime_up[i], busy[i]
        r.n_gpus, r.tensor_parallel = spec.n_gpus, spec.tensor_parallel
        r.pipeline_parallel, r.gpu = spec.pipeline_parallel, spec.gpu
        r.requested_gpu, r.priority, r.deadline_s = wanted[i], spec.priority, spec.deadline_s
        r.submit_time_s, r.user_runtime_estimate_s, r.reserved_gib = times[i], None, None
        r.cpus, r.host_memory_gib = spec.cpus, spec.host_memory_gib
        r.host_memory_floor_gib = floors[i]
        r.sync = GradientSync() if sync[i] is None else sync[i]
        _finish(r, spec.node_selector)
        out.append(r)
    return out


def gradient_syncs(specs: Sequence[JobSpec]) -> list[GradientSync]:
    """Per spec, its data-parallel gradient traffic (predictor.internode), computed only for
    the multi-GPU training jobs that could span nodes; the rest get zeros."""
    from predictor.internode import gradient_sync

    out = [GradientSync()] * len(specs)
    idx = [i for i, s in enumerate(specs) if s.n_gpus > 1 and s.task.is_training]
    for i, g in zip(idx, gradient_sync([specs[i] for i in idx]), strict=True):
        out[i] = g
    return out


def host_floor_gib(specs: Sequence[JobSpec]) -> list[float]:
    """The predictor's host memory estimate per spec (the floor under a job's host share)."""
    from predictor.host_memory import host_memory_gib

    return [float(x) for x in host_memory_gib(specs)]


def _finish(r: PlacementRequest, selector: Any) -> None:
    """What every request's constructor ends with: the selector in canonical form, the host
    figures checked and turned into :class:`HostAsk`, the GPU names and gang layout checked."""
    r.node_selector = None if selector is None else _selector(selector, r.job_id)
    _check_host(r)
    r.host_ask = HostAsk.of(r.cpus, r.host_memory_gib, r.host_memory_floor_gib)
    for name, v in (("gpu", r.gpu), ("requested_gpu", r.requested_gpu)):
        if v is not None and v not in TYPE_INDEX:
            raise PlacementError(
                f"job {r.job_id!r}: {name} {v!r} is not a GPU type; use one of "
                f"{', '.join(GPU_NAMES)}"
            )
    if r.n_gpus < 1 or r.n_gpus % (r.tensor_parallel * r.pipeline_parallel):
        raise PlacementError(
            f"job {r.job_id!r}: n_gpus={r.n_gpus} must be a positive multiple of "
            f"tensor_parallel x pipeline_parallel = "
            f"{r.tensor_parallel * r.pipeline_parallel}"
        )


def _selector(raw: Any, job_id: str) -> NodeSelector | None:
    """A request's selector in canonical form (a mapping, or the canonical pairs that
    ``dataclasses.replace`` passes back in)."""
    if isinstance(raw, tuple):
        raw = dict(raw)
    return node_selector(raw, f"job {job_id!r}: node_selector")


def _check_host(r: PlacementRequest) -> None:
    for name, hi in (("cpus", MAX_CPUS), ("host_memory_gib", MAX_HOST_MEMORY_GIB)):
        v = getattr(r, name)
        if v is not None and not (math.isfinite(v) and 0 < v <= hi):
            raise PlacementError(
                f"job {r.job_id!r}: {name} must be in (0, {hi:g}] or None (the node's share); "
                f"got {v!r}"
            )
    f = r.host_memory_floor_gib
    if not (math.isfinite(f) and 0 <= f <= MAX_HOST_MEMORY_GIB):
        raise PlacementError(
            f"job {r.job_id!r}: host_memory_floor_gib must be in [0, {MAX_HOST_MEMORY_GIB:g}] "
            f"GiB; got {f!r}"
        )


def requested_type(
    upper_gib: np.ndarray,
    n_gpus: int,
    wanted: str | None = None,
    pool: Pool | None = None,
) -> str:
    """The whole GPU type a user would request for a job: ``wanted`` (default: the habitual
    H100-80GB) if the job's upper bound fits one and, given a ``pool``, some node of that type
    holds its gang; else the smallest type that does; else ``wanted``.

    Users upsize when their habitual GPU is too small, and ask for a type that has a node big
    enough for their gang; without that the ``requested`` baseline would reject jobs nobody
    would submit. The live service and the simulator both call this, so the baseline is the
    same in both.
    """
    from predictor.gpus import get_gpu

    want = HABITUAL_GPU if wanted is None else wanted
    max_gang = None if pool is None else node_max_size(pool)

    def ok(name: str) -> bool:
        t = TYPE_INDEX[name]
        fits = upper_gib[t] <= get_gpu(name).memory_gib
        return bool(fits and (max_gang is None or max_gang[t] >= n_gpus))

    if ok(want):
        return want
    for name in sorted(GPU_NAMES, key=lambda n: get_gpu(n).memory_gib):
        if ok(name):
            return name
    return want


def requested_types(
    upper_gib: np.ndarray,
    n_gpus: npt.ArrayLike,
    wanted: Sequence[str | None],
    pool: Pool | None = None,
) -> list[str]:
    """:func:`requested_type` of many jobs at once: row ``i`` of ``upper_gib`` (one column
    per GPU type), ``n_gpus[i]`` and ``wanted[i]``; the same rule in arrays."""
    from predictor.gpus import get_gpu

    n = len(wanted)
    want = [HABITUAL_GPU if w is None else w for w in wanted]
    memory = np.array([get_gpu(g).memory_gib for g in GPU_NAMES])
    ok = np.asarray(upper_gib, np.float64).reshape(n, N_TYPES) <= memory
    if pool is not None:
        ok &= node_max_size(pool)[None, :] >= np.asarray(n_gpus).reshape(n, 1)
    at = np.fromiter((TYPE_INDEX[w] for w in want), np.int64, n)
    keep = ok[np.arange(n), at]
    # The smallest type that holds it (sorted by memory, ties in catalogue order).
    by_size = sorted(range(N_TYPES), key=lambda t: memory[t])
    fits = ok[:, by_size]
    smallest = np.asarray(by_size)[fits.argmax(axis=1)]
    pick = np.where(keep | ~fits.any(axis=1), at, smallest)
    return [GPU_NAMES[t] for t in pick.tolist()]


@dataclass(slots=True)
class RunningJob:
    """A placed job. ``predicted_end_s`` uses the option's predicted runtime; ``user_end_s``
    the user's own estimate when one was given (EASY backfill reads it)."""

    job_id: str
    option: Option
    start_s: float
    predicted_end_s: float
    user_end_s: float | None = None
    request: PlacementRequest | None = field(default=None, repr=False)


def probe_request(
    r: PlacementRequest,
    vram_gib: np.ndarray,
    vram_upper_gib: np.ndarray,
    runtime_s: np.ndarray,
    runtime_upper_s: np.ndarray,
) -> PlacementRequest:
    """What ``PlacementRequest(r.job_id, <figures>, n_gpus=r.n_gpus,
    tensor_parallel=r.tensor_parallel, pipeline_parallel=r.pipeline_parallel, gpu=r.gpu,
    busy_frac=r.busy_frac, node_selector=r.node_selector)`` builds (every other field at its
    default), without checking again what ``r``'s own construction checked: the figures are
    float64, one per type (checked as :meth:`PlacementRequest.with_figures` does)."""
    base = r.with_figures(vram_gib, vram_upper_gib, runtime_s, runtime_upper_s)
    base.requested_gpu, base.priority, base.deadline_s = HABITUAL_GPU, 0, None
    base.submit_time_s, base.user_runtime_estimate_s, base.reserved_gib = 0.0, None, None
    base.cpus, base.host_memory_gib, base.host_memory_floor_gib = None, None, 0.0
    base.sync, base.host_ask = GradientSync(), _NO_HOST_ASK
    return base


#: The host ask of a request without host figures.
_NO_HOST_ASK = HostAsk.of(None, None, 0.0)


_FIELDS = PlacementRequest.__slots__
_get_fields = operator.attrgetter(*_FIELDS)


def _shallow_copy(r: PlacementRequest) -> PlacementRequest:
    """``copy.copy(r)`` without the reduce protocol (every slot, the same objects)."""
    new = PlacementRequest.__new__(PlacementRequest)
    for name, v in zip(_FIELDS, _get_fields(r), strict=True):
        setattr(new, name, v)
    return new
