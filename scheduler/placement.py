"""Placement: what a job asks for, every way it could run, and how a choice becomes a Decision.

:func:`enumerate_options` returns one :class:`~scheduler.decision.Option` per option class of the
pool (whole GPUs of a type, a shared GPU of a type, a MIG profile of a type), each tested against
the job's predicted **upper** VRAM bound (or the larger ``reserved_gib`` after an OOM), priced,
and, where it fits now, bound to concrete GPUs. The feasibility maths is vectorised over classes
and reads per-state aggregates that the pool state computes once per change, so a saturated pool
answers "nothing fits" for thousands of queued jobs without rescanning its GPUs.

Gangs: all of a job's GPUs sit in one node (tensor- and pipeline-parallel groups need NVLink, and
one node keeps one worker queue per job). Jobs larger than the largest node of a type cannot use
that type; data-parallel replicas do not span nodes. MIG slices and shared GPUs take 1-GPU jobs.

Prices: ``price_usd_per_hour`` (pool overrides applied) x GPUs x runtime on the option / 3600.
A MIG slice is billed ``compute_slices / 7`` of its GPU and runs ``7 / compute_slices`` times
longer, so it costs what its whole GPU would (it wins by leaving the rest of the GPU to others).
A shared GPU is billed the job's memory share (reservation / GPU memory) at the GPU's runtime
(times the pool's ``shared_slowdown``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from predictor.gpus import GPU_NAMES

from .decision import Decision, Option
from .exceptions import PlacementError
from .pool import (
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
    "PlacementRequest",
    "RunningJob",
    "Select",
    "cheapest_index",
    "earliest_fit",
    "enumerate_options",
    "fits_anywhere",
    "make_decision",
    "pending_decision",
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


@dataclass(slots=True)
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

    def __post_init__(self) -> None:
        self.vram_gib = _type_vector(self.vram_gib, "vram_gib")
        self.vram_upper_gib = _type_vector(self.vram_upper_gib, "vram_upper_gib")
        self.runtime_s = _type_vector(self.runtime_s, "runtime_s")
        self.runtime_upper_s = _type_vector(self.runtime_upper_s, "runtime_upper_s")
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


@dataclass(slots=True)
class _Masks:
    need_mib: np.ndarray
    finite: np.ndarray
    cap_ok: np.ndarray
    kind_ok: np.ndarray
    pinned_ok: np.ndarray
    allowed: np.ndarray
    empty_room: np.ndarray
    fits_empty: np.ndarray
    fits_now: np.ndarray


def _masks(
    request: PlacementRequest,
    pool: Pool,
    now: Summary | None,
    empty: Summary,
    types: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    reserve_whole: bool = False,
) -> _Masks:
    """Per-class feasibility, vectorised over the pool's option classes."""
    ct = pool.class_type
    ck = pool.class_kind
    n = request.n_gpus
    need_gib = request.reservation_gib()[ct]
    finite = np.isfinite(need_gib) & np.isfinite(request.runtime_s[ct])
    need = np.ceil(np.where(finite, need_gib, 0.0) * MIB_PER_GIB - 1e-6).astype(np.int64)
    if reserve_whole:
        need = np.where(ck == KIND_WHOLE, pool.class_capacity_mib, need)
    cap_ok = need <= pool.class_capacity_mib
    is_whole = ck == KIND_WHOLE
    is_shared = ck == KIND_SHARED

    def room(s: Summary) -> np.ndarray:
        return np.where(  # type: ignore[no-any-return]
            is_whole,
            s.type_max_node_free[ct] >= n,
            np.where(is_shared, s.type_shared_free_mib[ct] >= need, s.class_avail > 0),
        )

    allowed = np.ones(pool.n_classes, bool)
    if types is not None:
        allowed &= np.isin(ct, [_TYPE_INDEX[t] for t in types])
    if kinds is not None:
        allowed &= np.isin(ck, [KIND_NAMES.index(k) for k in kinds])  # type: ignore[arg-type]
    if request.gpu is None:
        pinned_ok = np.ones(pool.n_classes, bool)
    else:
        pinned_ok = ct == _TYPE_INDEX[request.gpu]
    kind_ok = is_whole | (n == 1)
    empty_room = room(empty)
    fits_empty = finite & cap_ok & kind_ok & pinned_ok & allowed & empty_room
    fits_now = fits_empty & room(now) if now is not None else fits_empty
    return _Masks(
        need, finite, cap_ok, kind_ok, pinned_ok, allowed, empty_room, fits_empty, fits_now
    )


def fits_anywhere(request: PlacementRequest, pool: Pool) -> bool:
    """Whether any option of ``pool`` holds ``request`` when the pool is empty."""
    return bool(_masks(request, pool, None, pool.empty_summary()).fits_empty.any())


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
    ``fits_now`` against ``state``; options that fit now carry concrete GPUs chosen by
    ``select`` ("pack": the fullest node / GPU that still fits, "first": the lowest index).
    ``types``/``kinds`` restrict what a policy may use (others get ``why_excluded``);
    ``reserve_whole`` makes a whole-GPU option reserve the entire GPU (the user-request habit).
    """
    pool = state.pool
    now = state.summary()
    empty = pool.empty_summary() if empty_state is None else empty_state.summary()
    m = _masks(request, pool, now, empty, types, kinds, reserve_whole)
    ct, ck, n = pool.class_type, pool.class_kind, request.n_gpus
    need_mib, finite, cap_ok, kind_ok = m.need_mib, m.finite, m.cap_ok, m.kind_ok
    pinned_ok, allowed, empty_room = m.pinned_ok, m.allowed, m.empty_room
    fits_empty, fits_now = m.fits_empty, m.fits_now
    is_whole = ck == KIND_WHOLE
    is_shared = ck == KIND_SHARED
    max_node = _node_max_size(pool)[ct]

    runtime = request.runtime_s[ct] * pool.class_runtime_scale
    share = np.where(is_shared, need_mib / pool.class_capacity_mib, 1.0)
    gpus_billed = np.where(is_whole, n, 1)
    cost = pool.class_price_usd_per_hour * gpus_billed * share * runtime / 3600.0

    out: list[Option] = []
    vram = request.vram_gib
    upper = request.vram_upper_gib
    for c in range(pool.n_classes):
        t = int(ct[c])
        tname = GPU_NAMES[t]
        kind = int(ck[c])
        cap_mib = int(pool.class_capacity_mib[c])
        res_mib = int(need_mib[c])
        profile = pool.class_profile[c]
        node: str | None = None
        gpus: tuple[int, ...] = ()
        start: int | None = None
        leftover: float | None = None
        reason = ""
        if fits_now[c]:
            gpus, start, free_mib = _bind(pool, state, c, n, res_mib, select)
            node = pool.nodes[int(pool.gpu_node[gpus[0]])].name
            leftover = _gib(free_mib - res_mib)
        elif not finite[c]:
            reason = f"{tname}: no prediction for this GPU type"
        elif not pinned_ok[c]:
            reason = f"pinned to {request.gpu}"
        elif not allowed[c]:
            reason = why_excluded
        elif not kind_ok[c]:
            what = f"MIG {profile}" if kind == KIND_MIG else f"shared {tname}"
            reason = f"{what}: takes 1-GPU jobs only (job needs {n})"
        elif not cap_ok[c]:
            what = (
                f"{tname} MIG {profile}"
                if kind == KIND_MIG
                else (f"shared {tname}" if kind == KIND_SHARED else tname)
            )
            reason = f"{what}: needs {_gib(res_mib):.1f} GiB > {_gib(cap_mib):.1f} GiB"
        elif not empty_room[c]:
            if kind == KIND_WHOLE:
                reason = (
                    f"{tname}: needs {n} GPUs in one node; the largest {tname} node has "
                    f"{int(max_node[c])}"
                )
            elif kind == KIND_MIG:
                reason = f"{tname} MIG {profile}: no such slice in this pool"
            else:
                reason = f"shared {tname}: no shared GPU has {_gib(res_mib):.1f} GiB"
        else:
            if kind == KIND_WHOLE:
                more = n - int(now.type_max_node_free[t])
                reason = f"insufficient free {tname}: {more} more needed"
            elif kind == KIND_MIG:
                reason = f"insufficient free {tname} MIG {profile}: 1 more needed"
            else:
                best = int(now.type_shared_free_mib[t])
                reason = (
                    f"shared {tname}: needs {_gib(res_mib):.1f} GiB > {_gib(best):.1f} GiB free"
                    if best >= 0
                    else f"shared {tname}: every shared GPU is at max_shared_jobs"
                )
        out.append(
            Option(
                kind=KIND_NAMES[kind],
                gpu_type=tname,
                node=node,
                gpu_indices=gpus,
                mig_profile=profile,
                n_gpus=n if kind == KIND_WHOLE else 1,
                capacity_gib=_gib(cap_mib),
                reserved_gib=_gib(res_mib),
                vram_gib=_opt_float(float(vram[t])),
                vram_upper_gib=_opt_float(float(upper[t])),
                runtime_s=_opt_float(float(runtime[c])),
                cost_usd=_opt_float(float(cost[c])),
                fits_now=bool(fits_now[c]),
                fits_empty=bool(fits_empty[c]),
                reason=reason,
                mig_start=start,
                leftover_gib=leftover,
            )
        )
    return out


def _bind(
    pool: Pool, state: PoolState, c: int, n: int, res_mib: int, select: Select
) -> tuple[tuple[int, ...], int | None, int]:
    """Concrete GPUs for class ``c``: (gpu indices, MIG start or None, slot free MiB before)."""
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
        return tuple(int(g) for g in idle), None, int(pool.class_capacity_mib[c])
    if kind == KIND_SHARED:
        free = pool.capacity_mib - state.used_mib
        ok = (
            (pool.gpu_type == t)
            & (pool.gpu_mode == MODE_SHARED)
            & (state.shared_count < pool.max_shared)
            & (free >= res_mib)
        )
        idx = np.flatnonzero(ok)
        g = int(idx[np.argmin(free[idx])]) if select == "pack" else int(idx[0])
        return (g,), None, int(free[g])
    cands = _class_cands(pool)[c]
    cands = cands[state.summary().mig_avail[cands]]
    gpu = pool.cand_gpu[cands]
    if select == "pack":
        # Fullest GPU first (keeps whole GPUs free for big slices), then the slot order.
        key = np.lexsort((pool.cand_order[cands], gpu, -popcount15(state.mig_occ[gpu])))
    else:
        key = np.lexsort((pool.cand_order[cands], gpu))
    k = int(cands[key[0]])
    g = int(pool.cand_gpu[k])
    return (g,), int(pool.cand_start[k]), int(pool.class_capacity_mib[c])


# ---------------------------------------------------------------------------------------------
# choosing and recording


def _cost_key(o: Option) -> float:
    return o.cost_usd if o.cost_usd is not None else math.inf


def cheapest_index(options: Sequence[Option], *, now: bool = True) -> int | None:
    """Index of the cheapest option that fits now (``now=False``: on an empty pool).

    Ties go to the smaller slot, then to pool class order, so the smallest option that fits wins.
    """
    best: int | None = None
    best_key: tuple[float, float] = (math.inf, math.inf)
    for i, o in enumerate(options):
        if not (o.fits_now if now else o.fits_empty):
            continue
        key = (_cost_key(o), o.capacity_gib * o.n_gpus)
        if best is None or key < best_key:
            best, best_key = i, key
    return best


def make_decision(
    request: PlacementRequest,
    options: list[Option],
    chosen: int,
    *,
    policy: str,
    now_s: float,
    reason: str,
    rank: Callable[[Option], Any] = _cost_key,
    loser_reason: str = "ranked lower by this policy",
    states: Sequence[PoolState] = (),
) -> Decision:
    """A ``placed`` Decision: fills each feasible loser's reason and commits to ``states``."""
    best = options[chosen]
    best_cost = _cost_key(best)
    runner: int | None = None
    runner_key: Any = None
    for i, o in enumerate(options):
        if i == chosen or not o.fits_now:
            continue
        extra = _cost_key(o) - best_cost
        o.reason = f"costs ${extra:.2f} more than chosen" if extra >= 0.005 else loser_reason
        k = rank(o)
        if runner is None or k < runner_key:
            runner, runner_key = i, k
    for st in states:
        st.allocate(best, request.job_id)
    return Decision(
        job_id=request.job_id,
        policy=policy,
        state="placed",
        options=options,
        chosen=chosen,
        reason=reason,
        runner_up=runner,
        time_s=now_s,
    )


def pending_decision(
    request: PlacementRequest,
    options: list[Option],
    *,
    policy: str,
    now_s: float,
    reason: str | None = None,
) -> Decision:
    """A ``pending`` Decision; the default reason quotes what blocks the cheapest option."""
    if reason is None:
        i = cheapest_index(options, now=False)
        reason = "waiting: " + (options[i].reason if i is not None else "nothing fits now")
    return Decision(request.job_id, policy, "pending", options, None, reason, None, now_s)


def rejected_decision(
    request: PlacementRequest, options: list[Option], *, policy: str, now_s: float
) -> Decision:
    """A ``rejected`` Decision for a job that fits nowhere even on an empty pool."""
    seen: list[str] = []
    for o in options:
        if o.reason and o.reason not in seen:
            seen.append(o.reason)
    detail = "; ".join(seen[:8]) if seen else "the pool has no GPUs"
    reason = f"fits nowhere even on an empty pool: {detail}"
    return Decision(request.job_id, policy, "rejected", options, None, reason, None, now_s)


def earliest_fit(
    request: PlacementRequest,
    state: PoolState,
    running: Sequence[RunningJob],
    now_s: float,
    choose: Callable[[PoolState], tuple[list[Option], int | None]],
    *,
    end_of: Callable[[RunningJob], float] = lambda r: r.predicted_end_s,
) -> tuple[float, Option] | None:
    """When ``request`` could start if running jobs end as predicted, and on which option.

    Releases running jobs in order of ``end_of`` and binary-searches the shortest prefix after
    which ``choose`` finds an option (fitting only grows as jobs end). None if even releasing
    every running job does not help.
    """
    ends = sorted((r for r in running if r.job_id in state), key=end_of)

    def probe(k: int) -> tuple[list[Option], int | None]:
        s = state.copy()
        for r in ends[:k]:
            s.release(r.job_id)
        return choose(s)

    opts, idx = probe(len(ends))
    if idx is None:
        return None
    lo, hi = 0, len(ends)
    best = opts[idx]
    while lo < hi:
        mid = (lo + hi) // 2
        o, i = probe(mid)
        if i is not None:
            hi, best = mid, o[i]
        else:
            lo = mid + 1
    t = now_s if lo == 0 else max(now_s, end_of(ends[lo - 1]))
    return t, best
