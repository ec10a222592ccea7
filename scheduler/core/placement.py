"""Placement: what a job asks for, every way it could run, and how a choice becomes a Decision.

:func:`enumerate_options` returns one :class:`~scheduler.core.decision.Option` per option class of the
pool (whole GPUs of a type, a shared GPU of a type, a MIG profile of a type), each tested against
the job's predicted **upper** VRAM bound (or the larger ``reserved_gib`` after an OOM), priced,
and, where it fits now, bound to concrete GPUs. The feasibility maths is vectorised over classes
and reads per-state aggregates that the pool state computes once per change, so a saturated pool
answers "nothing fits" for thousands of queued jobs without rescanning its GPUs.

Gangs: all of a job's GPUs sit in one node (tensor- and pipeline-parallel groups need NVLink, and
one node keeps one worker queue per job). Jobs larger than the largest node of a type cannot use
that type; data-parallel replicas do not span nodes. MIG slices and shared GPUs take 1-GPU jobs.

Prices: ``price_usd_per_hour`` (pool overrides applied) x GPUs x runtime on the option / 3600.
A MIG slice is billed ``compute_slices / 7`` of its GPU. Only the part of the job that
saturates the GPU stretches on it: runtime = whole-GPU runtime x (1 + busy x (7/compute_slices
- 1)), with ``busy`` the predictor's busy fraction (1 when unknown). A roofline-bound job so
costs on a slice what it costs on the whole GPU; a launch-bound one (small-batch decoding)
barely slows down and pays a seventh.
A shared GPU is billed the job's memory share (reservation / GPU memory) at the GPU's runtime
(times the pool's ``shared_slowdown``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from predictor.gpus import GPU_NAMES

from scheduler.core.decision import Decision, Option
from scheduler.exceptions import PlacementError
from scheduler.core.pool import (
    KIND_MIG,
    KIND_NAMES,
    KIND_SHARED,
    KIND_WHOLE,
    MIB_PER_GIB,
    MODE_SHARED,
    MODE_WHOLE,
    Pool,
    PoolState,
    Summary,
    popcount15,
)

if TYPE_CHECKING:
    from predictor.prediction import PredictionTable
    from predictor.spec import JobSpec

__all__ = [
    "Binding",
    "OptionBatch",
    "OptionTable",
    "PlacementRequest",
    "RunningJob",
    "Select",
    "cheapest_index",
    "earliest_fit",
    "enumerate_options",
    "fits_anywhere",
    "fits_anywhere_many",
    "greedy_schedule",
    "option_table",
    "pending_decision",
    "place",
    "rejected_decision",
]

Select = Literal["pack", "first"]
_N_TYPES = len(GPU_NAMES)
_TYPE_INDEX = {n: i for i, n in enumerate(GPU_NAMES)}
# The GPU a user asks for today when nothing else is known: an H100 if the job fits one.
_HABITUAL_GPU = "H100-80GB"


def _type_vector(values: Any, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (_N_TYPES,):
        raise PlacementError(
            f"{name} must have one value per GPU type {GPU_NAMES} (shape ({_N_TYPES},)); "
            f"got shape {a.shape}"
        )
    return a


@dataclass(slots=True, init=False)
class PlacementRequest:
    """One job as the placer sees it. Per-type arrays are aligned with ``GPU_NAMES``.

    ``vram_*`` are per GPU in GiB, ``runtime_*`` seconds for the whole job; ``inf``/``nan``
    marks a type the predictor cannot place the job on. ``reserved_gib`` is the floor set after
    an OOM: the reservation is ``max(vram_upper_gib[type], reserved_gib)``. ``deadline_s`` is
    relative to ``submit_time_s``.
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
    requested_gpu: str = _HABITUAL_GPU
    priority: int = 0
    deadline_s: float | None = None
    submit_time_s: float = 0.0
    user_runtime_estimate_s: float | None = None
    reserved_gib: float | None = None
    busy_frac: np.ndarray = field(default_factory=lambda: np.ones(_N_TYPES))

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
        requested_gpu: str = _HABITUAL_GPU,
        priority: int = 0,
        deadline_s: float | None = None,
        submit_time_s: float = 0.0,
        user_runtime_estimate_s: float | None = None,
        reserved_gib: float | None = None,
        busy_frac: npt.ArrayLike | None = None,
    ) -> None:
        self.job_id = job_id
        self.vram_gib = _type_vector(vram_gib, "vram_gib")
        self.vram_upper_gib = _type_vector(vram_upper_gib, "vram_upper_gib")
        self.runtime_s = _type_vector(runtime_s, "runtime_s")
        self.runtime_upper_s = _type_vector(runtime_upper_s, "runtime_upper_s")
        # Unknown (or non-finite) busy fractions count as fully saturating: the safe side.
        busy = np.ones(_N_TYPES) if busy_frac is None else _type_vector(busy_frac, "busy_frac")
        self.busy_frac = np.clip(np.where(np.isfinite(busy), busy, 1.0), 0.0, 1.0)
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
        for name in ("gpu", "requested_gpu"):
            v = getattr(self, name)
            if v is not None and v not in _TYPE_INDEX:
                raise PlacementError(
                    f"job {self.job_id!r}: {name} {v!r} is not a GPU type; use one of "
                    f"{', '.join(GPU_NAMES)}"
                )
        if self.n_gpus < 1 or self.n_gpus % (self.tensor_parallel * self.pipeline_parallel):
            raise PlacementError(
                f"job {self.job_id!r}: n_gpus={self.n_gpus} must be a positive multiple of "
                f"tensor_parallel x pipeline_parallel = "
                f"{self.tensor_parallel * self.pipeline_parallel}"
            )

    @property
    def deadline_at_s(self) -> float | None:
        return None if self.deadline_s is None else self.submit_time_s + self.deadline_s

    def reservation_gib(self) -> np.ndarray:
        """Per-type reservation: never below the upper bound, raised by an OOM override."""
        if self.reserved_gib is None:
            return self.vram_upper_gib
        return np.maximum(self.vram_upper_gib, self.reserved_gib)

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
    ) -> PlacementRequest:
        """Build from a JobSpec and row ``i`` of a PredictionTable (missing types: infeasible).

        ``requested_gpu`` defaults to the spec's pinned ``gpu``, else an H100-80GB when the
        upper bound fits one (today's habit), else the smallest type that holds it.
        """
        arrays = {}
        for name in ("peak_vram_gib", "peak_vram_upper_gib", "runtime_s", "runtime_upper_s"):
            out = np.full(_N_TYPES, np.inf)
            col = getattr(table, name)
            for j, g in enumerate(table.gpu_names):
                if g in _TYPE_INDEX:
                    out[_TYPE_INDEX[g]] = float(col[i, j])
            arrays[name] = out
        busy = np.ones(_N_TYPES)
        if table.busy_frac is not None:
            for j, g in enumerate(table.gpu_names):
                if g in _TYPE_INDEX:
                    busy[_TYPE_INDEX[g]] = float(table.busy_frac[i, j])
        jid = job_id or spec.id or table.job_ids[i]
        if jid is None:
            raise PlacementError(f"row {i}: the job has no id; pass job_id= or set spec.id")
        upper = arrays["peak_vram_upper_gib"]
        if requested_gpu is None:
            requested_gpu = spec.gpu or _habitual_request(upper, spec.n_gpus)
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
        )


def _habitual_request(upper_gib: np.ndarray, n_gpus: int) -> str:
    from predictor.gpus import get_gpu

    if upper_gib[_TYPE_INDEX[_HABITUAL_GPU]] <= get_gpu(_HABITUAL_GPU).memory_gib:
        return _HABITUAL_GPU
    by_size = sorted(GPU_NAMES, key=lambda n: get_gpu(n).memory_gib)
    for name in by_size:
        if upper_gib[_TYPE_INDEX[name]] <= get_gpu(name).memory_gib:
            return name
    return by_size[-1]


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


# ---------------------------------------------------------------------------------------------
# enumeration


def _gib(mib: int | float) -> float:
    return float(mib) / MIB_PER_GIB


def _opt_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _class_cands(pool: Pool) -> list[np.ndarray]:
    cached = pool._empty.get("class_cands")
    if cached is None:
        cached = [np.flatnonzero(pool.cand_class == c) for c in range(pool.n_classes)]
        pool._empty["class_cands"] = cached
    return cached  # type: ignore[no-any-return]


def _node_max_size(pool: Pool) -> np.ndarray:
    cached = pool._empty.get("type_max_node")
    if cached is None:
        cached = np.zeros(_N_TYPES, np.int64)
        whole = pool.node_mode == MODE_WHOLE
        np.maximum.at(cached, pool.node_type[whole].astype(np.int64), pool.node_count[whole])
        pool._empty["type_max_node"] = cached
    return cached  # type: ignore[no-any-return]


def _class_masks(pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """(n_types, K) and (3, K) boolean masks: which classes are of each type / each kind."""
    cached = pool._empty.get("class_masks")
    if cached is None:
        by_type = pool.class_type[None, :] == np.arange(_N_TYPES)[:, None]
        by_kind = pool.class_kind[None, :] == np.arange(3)[:, None]
        cached = (by_type, by_kind)
        pool._empty["class_masks"] = cached
    return cached  # type: ignore[no-any-return]


def _shared_gpus(pool: Pool) -> np.ndarray:
    cached = pool._empty.get("shared_gpus")
    if cached is None:
        cached = np.flatnonzero(pool.gpu_mode == MODE_SHARED)
        pool._empty["shared_gpus"] = cached
    return cached  # type: ignore[no-any-return]


@dataclass(slots=True)
class Binding:
    """Where a chosen option lands: GPUs, node, MIG start, and the slot's free MiB before."""

    gpus: tuple[int, ...]
    node: str
    mig_start: int | None
    free_before_mib: int


class OptionBatch:
    """The state-independent half of option enumeration for many jobs, as (jobs, classes) arrays.

    Sizing, pricing, policy restrictions and "fits on an empty pool" do not change while a
    policy walks its queue, so they are computed once for the whole queue; :meth:`table` then
    adds the one state-dependent comparison per job ("fits now") in a few microseconds.
    ``types`` is one list of allowed GPU types for all jobs, or one per job (None: any).
    """

    __slots__ = (
        "_any_empty",
        "_cheapest_empty",
        "_chunk",
        "_ck",
        "_hi",
        "_lo",
        "_rows",
        "allowed",
        "cap_ok",
        "cost",
        "demand",
        "empty_room",
        "finite",
        "fits_empty",
        "kind_ok",
        "n_gpus",
        "need_mib",
        "pinned_ok",
        "pool",
        "requests",
        "runtime",
        "select",
        "size_mib",
        "why_excluded",
    )

    def __init__(
        self,
        requests: Sequence[PlacementRequest],
        pool: Pool,
        empty_state: PoolState | None = None,
        *,
        select: Select = "pack",
        types: Sequence[str] | Sequence[Sequence[str] | None] | None = None,
        kinds: Sequence[str] | None = None,
        reserve_whole: bool = False,
        why_excluded: str | Sequence[str] = "not considered by this policy",
    ) -> None:
        n_jobs = len(requests)
        k = pool.n_classes
        ct = pool.class_type
        by_type, by_kind = _class_masks(pool)
        is_whole = by_kind[KIND_WHOLE]
        is_shared = by_kind[KIND_SHARED]
        if n_jobs:
            upper = np.stack([r.vram_upper_gib for r in requests])
            rt = np.stack([r.runtime_s for r in requests])
        else:
            upper = rt = np.empty((0, _N_TYPES))
        n = np.fromiter((r.n_gpus for r in requests), np.int64, n_jobs)
        floor = np.fromiter(
            (0.0 if r.reserved_gib is None else r.reserved_gib for r in requests), float, n_jobs
        )
        pin = np.fromiter(
            (-1 if r.gpu is None else _TYPE_INDEX[r.gpu] for r in requests), np.int64, n_jobs
        )
        need_gib = np.maximum(upper, floor[:, None])[:, ct]
        busy = np.stack([r.busy_frac for r in requests]) if n_jobs else rt
        runtime = rt[:, ct] * (1.0 + busy[:, ct] * (pool.class_runtime_scale - 1.0))
        finite = np.isfinite(need_gib) & np.isfinite(runtime)
        need = np.ceil(np.where(finite, need_gib, 0.0) * MIB_PER_GIB).astype(np.int64)
        cap_ok = need <= pool.class_capacity_mib
        if reserve_whole:
            # The job must still fit; it then holds the whole GPU, as users do today.
            need = np.where(is_whole & cap_ok, pool.class_capacity_mib, need)
        allowed = np.ones((n_jobs, k), bool)
        if types is not None:
            if types and all(isinstance(t, str) for t in types):
                allowed &= by_type[[_TYPE_INDEX[t] for t in types]].any(axis=0)  # type: ignore[index]
            else:
                rows: list[int] = []
                cols: list[int] = []
                for i, ts in enumerate(types):
                    for t in GPU_NAMES if ts is None else ts:
                        rows.append(i)
                        cols.append(_TYPE_INDEX[t])  # type: ignore[index]
                ok_type = np.zeros((n_jobs, _N_TYPES), bool)
                ok_type[rows, cols] = True
                allowed &= ok_type[:, ct]
        if kinds is not None:
            allowed &= by_kind[[KIND_NAMES.index(x) for x in kinds]].any(axis=0)  # type: ignore[arg-type]
        pinned_ok = (pin[:, None] < 0) | (ct[None, :] == pin[:, None])
        kind_ok = is_whole[None, :] | (n[:, None] == 1)
        # What a job asks of each class, compared against Summary.class_supply.
        demand = np.where(is_whole, n[:, None], np.where(is_shared, need, 1))
        empty = pool.empty_summary() if empty_state is None else empty_state.summary()
        empty_room = empty.class_supply >= demand
        share = np.where(is_shared, need / pool.class_capacity_mib, 1.0)
        billed = np.where(is_whole, n[:, None], 1)
        cost = pool.class_price_usd_per_hour * billed * share * runtime / 3600.0

        self.requests = requests
        self.pool = pool
        self.need_mib = need
        self.finite = finite
        self.cap_ok = cap_ok
        self.kind_ok = kind_ok
        self.pinned_ok = pinned_ok
        self.allowed = allowed
        self.empty_room = empty_room
        self.fits_empty = finite & cap_ok & kind_ok & pinned_ok & allowed & empty_room
        self.demand = demand
        self.cost = np.where(finite, cost, np.inf)
        self.runtime = np.where(finite, runtime, np.inf)
        self.n_gpus = n
        self.select: Select = select
        self.why_excluded = why_excluded
        self.size_mib = pool.class_capacity_mib * np.where(is_whole, n[:, None], 1)
        # Cheapest option on an empty pool per job (ties: smaller, then class order); -1: none.
        masked = np.where(self.fits_empty, self.cost, np.inf)
        order = np.lexsort(
            (np.broadcast_to(np.arange(k), (n_jobs, k)), self.size_mib, masked), axis=-1
        )
        first = order[:, 0] if k else np.zeros(n_jobs, np.int64)
        ok = self.fits_empty[np.arange(n_jobs), first] if k else np.zeros(n_jobs, bool)
        self._cheapest_empty: list[int] = np.where(ok, first, -1).tolist()
        self._any_empty: list[bool] = self.fits_empty.any(axis=1).tolist()
        self._ck: tuple[int, int] = (0, -1)
        self._lo = self._hi = 0
        self._chunk = 8
        self._rows: list[bool] = []

    def __len__(self) -> int:
        return len(self.requests)

    def table(self, i: int, state: PoolState) -> OptionTable:
        """Job ``i``'s options against ``state`` (any state of this batch's pool).

        The table's :meth:`OptionTable.leftover` and :meth:`OptionTable.first` read ``state``
        when first called, so call them before the state changes.
        """
        t = self.row(i, state.summary())
        t._state = state
        return t

    def row(self, i: int, now: Summary) -> OptionTable:
        """Job ``i``'s options against a state summary (no GPU binding possible)."""
        t = OptionTable.__new__(OptionTable)
        pool = self.pool
        fits_empty = self.fits_empty[i]
        need = self.need_mib[i]
        t.request = self.requests[i]
        t.pool = pool
        t.now = now
        t.need_mib = need
        t.capacity_mib = pool.class_capacity_mib
        t.finite = self.finite[i]
        t.cap_ok = self.cap_ok[i]
        t.kind_ok = self.kind_ok[i]
        t.pinned_ok = self.pinned_ok[i]
        t.allowed = self.allowed[i]
        t.empty_room = self.empty_room[i]
        t.fits_empty = fits_empty
        t.fits_now = fits_empty & (now.class_supply >= self.demand[i])
        t.cost = self.cost[i]
        t.runtime = self.runtime[i]
        t.select = self.select
        w = self.why_excluded
        t.why_excluded = w if isinstance(w, str) else w[i]
        t.size = self.size_mib[i]
        ce = self._cheapest_empty[i]
        t.cheapest_empty = ce if ce >= 0 else None
        t._state = None
        t._leftover = None
        t._first = None
        return t

    def fits_empty_any(self, i: int) -> bool:
        return self._any_empty[i]

    def fits_now_any(self, i: int, state: PoolState) -> bool:
        """Whether any option of job ``i`` fits ``state`` now, answered for runs of jobs.

        While the state does not change (a saturated pool, a long queue) the answer for the
        next jobs comes from one (rows, classes) comparison, in chunks that double in size.
        """
        key = (id(state), state.version)
        if key != self._ck or not self._lo <= i < self._hi:
            self._chunk = 8 if key != self._ck else min(self._chunk * 2, 8192)
            hi = min(len(self.requests), i + self._chunk)
            supply = state.summary().class_supply
            rows = (self.fits_empty[i:hi] & (supply >= self.demand[i:hi])).any(axis=1)
            self._rows = rows.tolist()
            self._ck, self._lo, self._hi = key, i, hi
        return self._rows[i - self._lo]  # type: ignore[no-any-return]


class OptionTable:
    """Every option class of the pool for one job at one moment, as arrays over classes.

    This is the hot-path form of :func:`enumerate_options` (same arguments): policies rank
    options with numpy and bind concrete GPUs only for the one they choose; :meth:`options`
    builds the :class:`~scheduler.core.decision.Option` list for the placement log when someone
    reads it. Every array is computed up front, so a table stays valid after the state moves
    on. Many jobs at once: :class:`OptionBatch`.
    """

    __slots__ = (
        "_first",
        "_leftover",
        "_state",
        "allowed",
        "cap_ok",
        "capacity_mib",
        "cheapest_empty",
        "cost",
        "empty_room",
        "finite",
        "fits_empty",
        "fits_now",
        "kind_ok",
        "need_mib",
        "now",
        "pinned_ok",
        "pool",
        "request",
        "runtime",
        "select",
        "size",
        "why_excluded",
    )

    allowed: np.ndarray
    cap_ok: np.ndarray
    capacity_mib: np.ndarray
    cheapest_empty: int | None
    cost: np.ndarray
    empty_room: np.ndarray
    finite: np.ndarray
    fits_empty: np.ndarray
    fits_now: np.ndarray
    kind_ok: np.ndarray
    need_mib: np.ndarray
    now: Summary
    pinned_ok: np.ndarray
    pool: Pool
    request: PlacementRequest
    runtime: np.ndarray
    select: Select
    size: np.ndarray
    why_excluded: str
    _state: PoolState | None
    _leftover: np.ndarray | None
    _first: np.ndarray | None

    def __init__(
        self,
        request: PlacementRequest,
        state: PoolState,
        empty_state: PoolState | None = None,
        *,
        select: Select = "pack",
        types: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        reserve_whole: bool = False,
        why_excluded: str = "not considered by this policy",
    ) -> None:
        src = OptionBatch(
            [request],
            state.pool,
            empty_state,
            select=select,
            types=types,
            kinds=kinds,
            reserve_whole=reserve_whole,
            why_excluded=why_excluded,
        ).table(0, state)
        for name in OptionTable.__slots__:
            setattr(self, name, getattr(src, name))

    def _need_state(self, what: str) -> PoolState:
        if self._state is None:
            raise PlacementError(
                f"{what} needs the pool state; build the table with OptionBatch.table(i, state)"
            )
        return self._state

    def leftover(self) -> np.ndarray:
        """Per class, MiB the job leaves unreserved on the GPU it would get (bestfit's key).

        Whole GPU and MIG: slot size minus reservation; shared: what stays free on the
        best-fitting shared GPU. Classes that do not fit now keep the slot-size figure.
        """
        if self._leftover is None:
            pool = self.pool
            leftover = pool.class_capacity_mib - self.need_mib
            shared_now = self.fits_now & _class_masks(pool)[1][KIND_SHARED]
            if shared_now.any():
                state = self._need_state("leftover()")
                for c in np.flatnonzero(shared_now):
                    need = int(self.need_mib[c])
                    g = self._shared_gpu(pool, state, int(pool.class_type[c]), need, self.select)
                    leftover[c] = int(pool.capacity_mib[g] - state.used_mib[g]) - need
            self._leftover = leftover
        return self._leftover

    def first(self) -> np.ndarray:
        """Per class, the lowest GPU index the option could take now (first-fit's key)."""
        if self._first is None:
            first = np.full(self.pool.n_classes, 1 << 40, np.int64)
            if self.fits_now.any():
                state = self._need_state("first()")
                n = self.request.n_gpus
                for c in np.flatnonzero(self.fits_now):
                    b = _bind(self.pool, state, int(c), n, int(self.need_mib[c]), "first")
                    first[c] = b.gpus[0]
            self._first = first
        return self._first

    @staticmethod
    def _shared_gpu(pool: Pool, state: PoolState, t: int, need: int, select: Select) -> int:
        idx = _shared_gpus(pool)
        free = pool.capacity_mib[idx] - state.used_mib[idx]
        ok = (
            (pool.gpu_type[idx] == t)
            & (state.shared_count[idx] < pool.max_shared[idx])
            & (free >= need)
        )
        cand = np.flatnonzero(ok)
        k = int(cand[np.argmin(free[cand])]) if select == "pack" else int(cand[0])
        return int(idx[k])

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.fits_now.shape[0])

    def size_mib(self) -> np.ndarray:
        """Memory the option occupies across all its GPUs (ties go to the smallest)."""
        return self.size

    def best(self, keys: Sequence[np.ndarray], mask: np.ndarray) -> int | None:
        """Index minimising ``keys`` (lexsort order: last key is primary) among ``mask``."""
        # Masked-out classes sort last on an extra, most significant key; ties keep class order.
        order = np.lexsort((*keys, ~mask))
        c = int(order[0])
        return c if mask[c] else None

    def cost_keys(self) -> tuple[np.ndarray, ...]:
        return (self.size_mib(), self.cost)

    def cheapest(self, *, now: bool = True) -> int | None:
        if not now:
            return self.cheapest_empty
        return self.best(self.cost_keys(), self.fits_now)

    def reason(self, c: int) -> str:
        """Why class ``c`` cannot run this job now ("" when it can)."""
        if self.fits_now[c]:
            return ""
        pool = self.pool
        t = int(pool.class_type[c])
        tname = GPU_NAMES[t]
        kind = int(pool.class_kind[c])
        profile = pool.class_profile[c]
        n = self.request.n_gpus
        need = int(self.need_mib[c])
        if not self.finite[c]:
            return f"{tname}: no prediction for this GPU type"
        if not self.pinned_ok[c]:
            return f"pinned to {self.request.gpu}"
        if not self.allowed[c]:
            return self.why_excluded
        if not self.kind_ok[c]:
            what = f"MIG {profile}" if kind == KIND_MIG else f"shared {tname}"
            return f"{what}: takes 1-GPU jobs only (job needs {n})"
        if not self.cap_ok[c]:
            what = {KIND_MIG: f"{tname} MIG {profile}", KIND_SHARED: f"shared {tname}"}.get(
                kind, tname
            )
            return f"{what}: needs {_gib(need):.1f} GiB > {_gib(int(self.capacity_mib[c])):.1f} GiB"
        if not self.empty_room[c]:
            if kind == KIND_WHOLE:
                largest = int(_node_max_size(pool)[t])
                return (
                    f"{tname}: needs {n} GPUs in one node; the largest {tname} node has {largest}"
                )
            if kind == KIND_MIG:
                return f"{tname} MIG {profile}: no such slice in this pool"
            return f"shared {tname}: no shared GPU has {_gib(need):.1f} GiB"
        if kind == KIND_WHOLE:
            more = n - int(self.now.type_max_node_free[t])
            return f"insufficient free {tname}: {more} more needed"
        if kind == KIND_MIG:
            return f"insufficient free {tname} MIG {profile}: 1 more needed"
        best = int(self.now.type_shared_free_mib[t])
        if best < 0:
            return f"shared {tname}: every shared GPU is at max_shared_jobs"
        return f"shared {tname}: needs {_gib(need):.1f} GiB > {_gib(best):.1f} GiB free"

    # -- binding and materialising -----------------------------------------------------------

    def bind(self, c: int, state: PoolState) -> Binding:
        """Concrete GPUs for class ``c`` on ``state`` (which must be the table's state)."""
        if not self.fits_now[c]:
            raise PlacementError(
                f"job {self.request.job_id!r}: option {self.pool.class_label(c)} does not fit "
                f"now ({self.reason(c)})"
            )
        return _bind(self.pool, state, c, self.request.n_gpus, int(self.need_mib[c]), self.select)

    def option(self, c: int, binding: Binding | None = None, reason: str | None = None) -> Option:
        pool = self.pool
        t = int(pool.class_type[c])
        kind = int(pool.class_kind[c])
        vram = float(self.request.vram_gib[t])
        upper = float(self.request.vram_upper_gib[t])
        need = int(self.need_mib[c])
        leftover: float | None = None
        if binding is not None:
            leftover = _gib(binding.free_before_mib - need)
        return Option(
            kind=KIND_NAMES[kind],
            gpu_type=GPU_NAMES[t],
            node=binding.node if binding is not None else None,
            gpu_indices=binding.gpus if binding is not None else (),
            mig_profile=pool.class_profile[c],
            n_gpus=self.request.n_gpus if kind == KIND_WHOLE else 1,
            capacity_gib=_gib(int(self.capacity_mib[c])),
            reserved_gib=_gib(need),
            vram_gib=vram if math.isfinite(vram) else None,
            vram_upper_gib=upper if math.isfinite(upper) else None,
            runtime_s=_opt_float(float(self.runtime[c])),
            cost_usd=_opt_float(float(self.cost[c])),
            fits_now=bool(self.fits_now[c]),
            fits_empty=bool(self.fits_empty[c]),
            reason=self.reason(c) if reason is None else reason,
            mig_start=binding.mig_start if binding is not None else None,
            leftover_gib=leftover,
        )

    def options(
        self,
        chosen: int | None = None,
        chosen_option: Option | None = None,
        *,
        loser_reason: str = "ranked lower by this policy",
        by_cost: bool = True,
        override_reason: str | None = None,
    ) -> list[Option]:
        """The Option list for a Decision; feasible losers say why the chosen one beat them."""
        out: list[Option] = []
        chosen_cost = float(self.cost[chosen]) if chosen is not None else math.inf
        for c in range(len(self)):
            if c == chosen and chosen_option is not None:
                out.append(chosen_option)
                continue
            reason: str | None = None
            if self.fits_now[c]:
                if override_reason is not None:
                    reason = override_reason
                elif chosen is not None:
                    extra = float(self.cost[c]) - chosen_cost
                    reason = (
                        f"costs ${extra:.2f} more than chosen"
                        if by_cost and extra >= 0.005
                        else loser_reason
                    )
            out.append(self.option(c, reason=reason))
        return out


def _bind(pool: Pool, state: PoolState, c: int, n: int, res_mib: int, select: Select) -> Binding:
    """Concrete GPUs for class ``c`` chosen by ``select`` ("pack": fullest that fits)."""
    kind = int(pool.class_kind[c])
    t = int(pool.class_type[c])
    if kind == KIND_WHOLE:
        s = state.summary()
        ok = (pool.node_type == t) & (pool.node_mode == MODE_WHOLE) & (s.node_free >= n)
        nodes = np.flatnonzero(ok)
        k = int(nodes[np.argmin(s.node_free[nodes])]) if select == "pack" else int(nodes[0])
        a = int(pool.node_first[k])
        b = a + int(pool.node_count[k])
        idle = np.flatnonzero(~state.busy[a:b] & (state.used_mib[a:b] == 0))[:n] + a
        gpus = tuple(int(g) for g in idle)
        return Binding(gpus, pool.nodes[k].name, None, int(pool.class_capacity_mib[c]))
    if kind == KIND_SHARED:
        g = OptionTable._shared_gpu(pool, state, t, res_mib, select)
        free = int(pool.capacity_mib[g] - state.used_mib[g])
        return Binding((g,), pool.nodes[int(pool.gpu_node[g])].name, None, free)
    cands = _class_cands(pool)[c]
    cands = cands[state.summary().mig_avail[cands]]
    gpu = pool.cand_gpu[cands]
    if select == "pack":
        # Fullest GPU first (keeps empty GPUs whole for big slices), then the slot order.
        key = np.lexsort((pool.cand_order[cands], gpu, -popcount15(state.mig_occ[gpu])))
    else:
        key = np.lexsort((pool.cand_order[cands], gpu))
    k = int(cands[key[0]])
    g = int(pool.cand_gpu[k])
    node = pool.nodes[int(pool.gpu_node[g])].name
    return Binding((g,), node, int(pool.cand_start[k]), int(pool.class_capacity_mib[c]))


def option_table(
    request: PlacementRequest,
    state: PoolState,
    empty_state: PoolState | None = None,
    **kwargs: Any,
) -> OptionTable:
    """The array form of :func:`enumerate_options` (same arguments)."""
    return OptionTable(request, state, empty_state, **kwargs)


def fits_anywhere(request: PlacementRequest, pool: Pool) -> bool:
    """Whether any option of ``pool`` holds ``request`` when the pool is empty."""
    return fits_anywhere_many([request], pool)[0]


def fits_anywhere_many(requests: Sequence[PlacementRequest], pool: Pool) -> list[bool]:
    """:func:`fits_anywhere` for many jobs in one vectorised pass."""
    return list(OptionBatch(requests, pool)._any_empty)


def enumerate_options(
    request: PlacementRequest,
    state: PoolState,
    empty_state: PoolState | None = None,
    *,
    select: Select = "pack",
    types: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    reserve_whole: bool = False,
    why_excluded: str = "not considered by this policy",
) -> list[Option]:
    """Every option class of the pool for ``request``, in the pool's class order.

    ``fits_empty`` is judged against ``empty_state`` (default: the pool with nothing running),
    ``fits_now`` against ``state``; every option that fits now is bound to the concrete GPUs
    ``select`` picks ("pack": the fullest node / GPU that still fits, "first": the lowest
    index). ``types``/``kinds`` restrict what a policy may use (others get ``why_excluded``);
    ``reserve_whole`` makes a whole-GPU option reserve the entire GPU (the user-request habit).
    """
    table = OptionTable(
        request,
        state,
        empty_state,
        select=select,
        types=types,
        kinds=kinds,
        reserve_whole=reserve_whole,
        why_excluded=why_excluded,
    )
    return [
        table.option(c, table.bind(c, state) if table.fits_now[c] else None)
        for c in range(len(table))
    ]


# ---------------------------------------------------------------------------------------------
# choosing and recording


def cheapest_index(options: Sequence[Option], *, now: bool = True) -> int | None:
    """Index of the cheapest Option that fits now (``now=False``: on an empty pool).

    Ties go to the smaller slot, then to pool class order, so the smallest option that fits wins.
    """
    best: int | None = None
    best_key: tuple[float, float] = (math.inf, math.inf)
    for i, o in enumerate(options):
        if not (o.fits_now if now else o.fits_empty):
            continue
        cost = o.cost_usd if o.cost_usd is not None else math.inf
        key = (cost, o.capacity_gib * o.n_gpus)
        if best is None or key < best_key:
            best, best_key = i, key
    return best


Keys = Callable[[OptionTable], Sequence[np.ndarray]]


def place(
    table: OptionTable,
    chosen: int,
    state: PoolState,
    *,
    policy: str,
    now_s: float,
    reason: str,
    keys: Keys = OptionTable.cost_keys,
    loser_reason: str = "ranked lower by this policy",
    by_cost: bool = True,
    binding: Binding | None = None,
) -> Decision:
    """Bind ``chosen`` on ``state``, commit it, and return the ``placed`` Decision."""
    b = binding if binding is not None else table.bind(chosen, state)
    opt = table.option(chosen, b, reason="")
    state.allocate(opt, table.request.job_id)
    others = table.fits_now.copy()
    others[chosen] = False
    runner = table.best(keys(table), others)

    def thunk() -> list[Option]:
        return table.options(chosen, opt, loser_reason=loser_reason, by_cost=by_cost)

    return Decision(
        table.request.job_id,
        policy,
        "placed",
        chosen=chosen,
        reason=reason,
        runner_up=runner,
        time_s=now_s,
        options_thunk=thunk,
    )


def pending_decision(
    table: OptionTable,
    *,
    policy: str,
    now_s: float,
    reason: str | None = None,
    loser_reason: str | None = None,
) -> Decision:
    """A ``pending`` Decision; the default reason quotes what blocks the cheapest option."""
    thunks = _PendingThunks(table, None, 0, None, reason, loser_reason)
    return _lazy_pending(thunks, table.request.job_id, policy, now_s)


class _PendingThunks:
    """Builds a pending Decision's option table, reason and options only when read.

    Pending decisions are made for every queued job on every tick; one small object per job
    (instead of closures) keeps that cheap.
    """

    __slots__ = ("batch", "i", "loser_reason", "now", "reason", "table")

    def __init__(
        self,
        table: OptionTable | None,
        batch: OptionBatch | None,
        i: int,
        now: Summary | None,
        reason: str | None,
        loser_reason: str | None,
    ) -> None:
        self.table = table
        self.batch = batch
        self.i = i
        self.now = now
        self.reason = reason
        self.loser_reason = loser_reason

    def get(self) -> OptionTable:
        if self.table is None:
            assert self.batch is not None and self.now is not None
            self.table = self.batch.row(self.i, self.now)
        return self.table

    def why(self) -> str:
        table = self.get()
        i = table.cheapest_empty
        if i is None:
            return "waiting: nothing fits now"
        if table.fits_now[i]:
            return "waiting: held back by the policy although an option fits now"
        return "waiting: " + table.reason(i)

    def options(self) -> list[Option]:
        return self.get().options(override_reason=self.loser_reason or self.reason)


def _lazy_pending(thunks: _PendingThunks, job_id: str, policy: str, now_s: float) -> Decision:
    return Decision(
        job_id,
        policy,
        "pending",
        reason=thunks.reason or "",
        time_s=now_s,
        options_thunk=thunks.options,
        reason_thunk=None if thunks.reason else thunks.why,
    )


def rejected_decision(table: OptionTable, *, policy: str, now_s: float) -> Decision:
    """A ``rejected`` Decision for a job that fits nowhere even on an empty pool."""
    options = table.options()
    seen: list[str] = []
    for o in options:
        if o.reason and o.reason not in seen:
            seen.append(o.reason)
    detail = "; ".join(seen[:8]) if seen else "the pool has no GPUs"
    reason = f"fits nowhere even on an empty pool: {detail}"
    return Decision(table.request.job_id, policy, "rejected", options, None, reason, None, now_s)


Probe = Callable[[PoolState], tuple[OptionTable, int | None]]


def earliest_fit(
    state: PoolState,
    running: Sequence[RunningJob],
    now_s: float,
    probe: Probe,
    *,
    end_of: Callable[[RunningJob], float] = lambda r: r.predicted_end_s,
) -> tuple[float, Option] | None:
    """When a job could start if running jobs end as predicted, and on which (bound) option.

    ``probe`` returns the job's option table on a state and the policy's pick (or None).
    Releases running jobs in order of ``end_of`` and binary-searches the shortest prefix after
    which ``probe`` picks something (fitting only grows as jobs end). None if even releasing
    every running job does not help.
    """
    ends = sorted((r for r in running if r.job_id in state), key=end_of)

    def at(k: int) -> tuple[PoolState, OptionTable, int | None]:
        s = state.copy()
        for r in ends[:k]:
            s.release(r.job_id)
        table, idx = probe(s)
        return s, table, idx

    s, table, idx = at(len(ends))
    if idx is None:
        return None
    lo, hi = 0, len(ends)
    best = (s, table, idx)
    while lo < hi:
        mid = (lo + hi) // 2
        s, table, idx = at(mid)
        if idx is not None:
            hi, best = mid, (s, table, idx)
        else:
            lo = mid + 1
    s, table, idx = best
    assert idx is not None
    t = now_s if lo == 0 else max(now_s, end_of(ends[lo - 1]))
    return t, table.option(idx, table.bind(idx, s))


BatchFor = Callable[[Sequence[PlacementRequest], Pool], OptionBatch]
# (reason, start time, option) when a job should wait for a better option it can reserve.
WaitHook = Callable[
    [OptionTable, int, PoolState, Sequence[RunningJob], float],
    tuple[str, float, Option] | None,
]


def _runtime(_req: PlacementRequest, o: Option) -> float:
    return o.runtime_s if o.runtime_s is not None else math.inf


def greedy_schedule(
    pending: Sequence[PlacementRequest],
    state: PoolState,
    now_s: float,
    running: Sequence[RunningJob],
    *,
    policy: str,
    batch_for: BatchFor = OptionBatch,
    keys: Keys = OptionTable.cost_keys,
    chosen_reason: Callable[[Option], str],
    loser_reason: str = "ranked lower by this policy",
    by_cost: bool = True,
    backfill: bool = False,
    strict_fifo: bool = False,
    job_runtime: Callable[[PlacementRequest, Option], float] = _runtime,
    running_end: Callable[[RunningJob], float] = lambda r: r.predicted_end_s,
    wait_hook: WaitHook | None = None,
) -> list[Decision]:
    """The queue loop every greedy policy shares: decide each job in order, commit as you go.

    ``batch_for`` sizes and prices the whole queue once (policies restrict types and kinds
    there); each job takes the option minimising ``keys`` among those that fit now.
    ``backfill`` gives the first job that cannot start a reservation at the earliest time
    running jobs (and jobs placed earlier in this call) free enough capacity, per
    ``running_end``; later jobs start only if they end before it (per ``job_runtime``) or stay
    off its GPUs. ``strict_fifo`` without backfill makes every job behind a blocked head wait.
    """
    decisions: list[Decision] = []
    head: tuple[str, float, tuple[int, ...]] | None = None
    fenced: PoolState | None = None
    reserve_tried = False
    blocked_by: str | None = None
    live = list(running)

    def pick(table: OptionTable) -> int | None:
        return table.best(keys(table), table.fits_now)

    batch = batch_for(pending, state.pool)

    def probe_for(i: int) -> Probe:
        def f(s: PoolState) -> tuple[OptionTable, int | None]:
            t = batch.table(i, s)
            return t, pick(t)

        return f

    for i, req in enumerate(pending):
        if not batch.fits_empty_any(i):
            table = batch.table(i, state)
            decisions.append(rejected_decision(table, policy=policy, now_s=now_s))
            continue
        if blocked_by is not None:
            why = f"waiting behind {blocked_by} (first in, first out)"
            th = _PendingThunks(None, batch, i, state.summary(), why, None)
            decisions.append(_lazy_pending(th, req.job_id, policy, now_s))
            continue
        if not batch.fits_now_any(i, state) and (not backfill or reserve_tried):
            th = _PendingThunks(None, batch, i, state.summary(), None, None)
            decisions.append(_lazy_pending(th, req.job_id, policy, now_s))
            if strict_fifo and not backfill:
                blocked_by = req.job_id
            continue
        table = batch.table(i, state)
        idx = pick(table)
        binding: Binding | None = None
        note = ""
        if idx is not None and head is not None and fenced is not None:
            head_id, head_t, head_gpus = head
            binding = table.bind(idx, state)
            est = job_runtime(req, table.option(idx, binding, reason=""))
            if now_s + est > head_t and set(binding.gpus) & set(head_gpus):
                ftable = batch.table(i, fenced)
                fidx = pick(ftable)
                if fidx is None:
                    why = f"would delay {head_id}, which holds a reservation from t={head_t:.0f}s"
                    decisions.append(
                        pending_decision(
                            table, policy=policy, now_s=now_s, reason=why, loser_reason=why
                        )
                    )
                    continue
                # The fenced table's arrays match the real state except on the fence, so its
                # pick is valid on the real state too; bind it there.
                binding = ftable.bind(fidx, fenced)
                table, idx = ftable, fidx
            note = f" (backfilled ahead of {head_id})"
        wait: tuple[str, float, Option] | None = None
        if idx is not None and wait_hook is not None:
            wait = wait_hook(table, idx, state, live, now_s)
        if idx is not None and wait is None:
            d = place(
                table,
                idx,
                state,
                policy=policy,
                now_s=now_s,
                reason="",
                keys=keys,
                loser_reason=loser_reason,
                by_cost=by_cost,
                binding=binding,
            )
            opt = state.option_of(req.job_id)
            d.reason = chosen_reason(opt) + note
            decisions.append(d)
            if backfill:
                live.append(RunningJob(req.job_id, opt, now_s, now_s + _runtime(req, opt)))
            if head is not None:
                fenced = state.fenced(head[2])
            continue
        if wait is not None:
            d = pending_decision(table, policy=policy, now_s=now_s, reason=wait[0])
            reserve: tuple[float, Option] | None = (wait[1], wait[2])
        else:
            d = pending_decision(table, policy=policy, now_s=now_s)
            reserve = None
            if backfill and not reserve_tried:
                reserve_tried = True
                reserve = earliest_fit(state, live, now_s, probe_for(i), end_of=running_end)
        if backfill and head is None and reserve is not None:
            t, o = reserve
            head = (req.job_id, t, o.gpu_indices)
            fenced = state.fenced(o.gpu_indices)
            d.reason += f"; reserved {o.label} on {o.node} from t={t:.0f}s"
        decisions.append(d)
        if strict_fifo and not backfill:
            blocked_by = req.job_id
    return decisions
