"""Enumerate and price: every way a job could run on a pool, as arrays over option classes.

:func:`enumerate_options` returns one :class:`~scheduler.core.decision.Option` per option class
of the pool (whole GPUs of a type, a shared GPU of a type, a MIG profile of a type), each
tested against the job's predicted **upper** VRAM bound (or the larger ``reserved_gib`` after an
OOM), priced, and, where it fits now, bound to concrete GPUs. The feasibility maths is vectorised
over classes and reads per-state aggregates that the pool state computes once per change, so a
saturated pool answers "nothing fits" for thousands of queued jobs without rescanning its GPUs.

Host resources: each option also needs its node's CPUs and host memory (the job's own figures,
or the node's share of the slot, :mod:`scheduler.core.host`). Jobs within their share on nodes
where every job is within its share pass on the GPU test alone; the rest are checked node by
node (:mod:`scheduler.core._host_fit`), and an option that loses only on CPU or memory says
which ("needs 24 CPUs, 16 free on b200-0").

Node selectors (:mod:`scheduler.core.selector`): a job's selector is one mask over the nodes;
classes no matching node hosts lose naming it, and classes it narrows take the node-by-node
check above, so "fits now" and the binding only see matching nodes.

Gangs: a job that fits one node of a type keeps all its GPUs in one node there (its tensor- and
pipeline-parallel groups on NVLink). A job larger than the largest node of a type becomes a
multi-node gang on that type (:mod:`scheduler.core.gang`): equal shares of whole nodes, tensor
parallelism inside a node, fewest racks first, priced with its inter-node all-reduce; its fit is
planned per job (the fast class-supply comparison cannot express it). MIG slices and shared GPUs
take 1-GPU jobs.

Prices: ``price_usd_per_hour`` (pool overrides applied) x GPUs x runtime on the option / 3600.
A MIG slice is billed ``compute_slices / 7`` of its GPU. Only the part of the job that
saturates the GPU stretches on it: runtime = whole-GPU runtime x (1 + busy x (7/compute_slices
- 1)), with ``busy`` the predictor's busy fraction (1 when unknown). A roofline-bound job so
costs on a slice what it costs on the whole GPU; a launch-bound one (small-batch decoding)
barely slows down and pays a seventh.
A shared GPU is billed the job's memory share (reservation / GPU memory), which is also its
compute share (the MPS active-thread percentage, :mod:`scheduler.core.shares`): the saturating
part of the job stretches by 1 / share, as on a slice (times the pool's ``shared_slowdown``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core._classes import class_masks
from scheduler.core._host_fit import asks, host_masks, host_refine, no_short
from scheduler.core.binding import Select
from scheduler.core.decision import Option
from scheduler.core.gang import gang_mask, gang_network_s, plan_gang
from scheduler.core.host import HostAsk
from scheduler.core.pool import (
    KIND_MIG,
    KIND_NAMES,
    KIND_SHARED,
    KIND_WHOLE,
    MIB_PER_GIB,
    Pool,
)
from scheduler.core.requests import N_TYPES, TYPE_INDEX, PlacementRequest
from scheduler.core.selector import gang_free, selector_masks
from scheduler.core.shares import shared_compute_share
from scheduler.core.state import PoolState, Summary
from scheduler.core.table import OptionTable
from scheduler.core.table_columns import empty_codes

__all__ = [
    "OptionBatch",
    "enumerate_options",
    "fits_anywhere",
    "fits_anywhere_many",
    "option_table",
]


#: No slot is this large (1 EiB); what asks for more is capped here, then refused as too big.
_MAX_NEED_GIB = float(2**30)

#: The OptionBatch fields that hold one row per job (:meth:`OptionBatch.rows` slices them).
_ROW_ARRAYS = (
    "allowed",
    "ask_cpu",
    "ask_floor",
    "ask_host",
    "cap_ok",
    "cost",
    "demand",
    "empty_code",
    "empty_room",
    "finite",
    "fits_empty",
    "gang",
    "host_empty",
    "host_exact",
    "kind_ok",
    "n_gpus",
    "need_mib",
    "node_ok",
    "pinned_ok",
    "runtime",
    "sel_ok",
    "size_mib",
    "tensor_parallel",
)


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
        "_exact_any",
        "_gang_rows",
        "_hi",
        "_lo",
        "_now",
        "_ok",
        "_rows",
        *_ROW_ARRAYS,
        "pool",
        "requests",
        "select",
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
        ct = pool.class_type
        by_kind = class_masks(pool)[1]
        is_whole = by_kind[KIND_WHOLE]
        is_shared = by_kind[KIND_SHARED]
        n, pin, need, finite, cap_ok, runtime = _sizes(requests, pool, by_kind, reserve_whole)
        allowed = _allowed(n_jobs, pool, types, kinds)
        pinned_ok = (pin[:, None] < 0) | (ct[None, :] == pin[:, None])
        kind_ok = is_whole[None, :] | (n[:, None] == 1)
        # What a job asks of each class, compared against Summary.class_supply.
        demand = np.where(is_whole, n[:, None], np.where(is_shared, need, 1))
        empty = pool.empty_summary() if empty_state is None else empty_state.summary()
        empty_room = empty.class_supply >= demand
        # Jobs larger than any node of a type: a multi-node gang there (scheduler.core.gang).
        gang = gang_mask(pool, n) & cap_ok & finite & pinned_ok & allowed
        # Node selectors (scheduler.core.selector): which classes a matching node can host.
        sel = selector_masks(requests, pool, gang)
        self.node_ok, self.sel_ok = sel.nodes, sel.class_ok
        tp = np.fromiter((r.tensor_parallel for r in requests), np.int64, n_jobs)
        for i, c in zip(*np.nonzero(gang), strict=True):
            fits, charged, net = _gang_empty(
                pool, empty_state, empty, int(c), requests[i], int(need[i, c]), sel.nodes[i]
            )
            empty_room[i, c] = fits
            # Priced with the gradient all-reduce over the gang's network, not NVLink.
            runtime[i, c] = max(float(runtime[i, c]) - charged, 0.0) + net
        share = np.where(is_shared, need / pool.class_capacity_mib, 1.0)
        billed = np.where(is_whole, n[:, None], 1)
        cost = pool.class_price_usd_per_hour * billed * share * runtime / 3600.0
        gpu_empty = finite & cap_ok & kind_ok & pinned_ok & allowed & empty_room & sel.class_ok
        self.ask_cpu, self.ask_host, self.ask_floor = asks(requests)
        # A gang's plan already checked each node's CPUs and memory.
        self.host_exact, self.host_empty = host_masks(
            pool, n, need, self.ask_cpu, self.ask_host, self.ask_floor, gpu_empty & ~gang, sel
        )
        if gang.any():
            self.host_exact = self.host_exact & ~gang
            self.host_empty = self.host_empty | gang
        self.gang = gang
        self.tensor_parallel = tp
        self._gang_rows: frozenset[int] = frozenset(np.flatnonzero(gang.any(axis=1)).tolist())

        self.requests = requests
        self.pool = pool
        self.need_mib = need
        self.finite = finite
        self.cap_ok = cap_ok
        self.kind_ok = kind_ok
        self.pinned_ok = pinned_ok
        self.allowed = allowed
        self.empty_room = empty_room
        self.fits_empty = gpu_empty & self.host_empty
        self.empty_code = empty_codes(self, by_kind[KIND_MIG])
        self._exact_any = bool(self.host_exact.any())
        self.demand = demand
        self.cost = np.where(finite, cost, np.inf)
        self.runtime = np.where(finite, runtime, np.inf)
        self.n_gpus = n
        self.select: Select = select
        self.why_excluded = why_excluded
        self.size_mib = pool.class_capacity_mib * np.where(is_whole, n[:, None], 1)
        self._cheapest_empty: list[int] = _cheapest(self.fits_empty, self.cost, self.size_mib)
        self._any_empty: list[bool] = self.fits_empty.any(axis=1).tolist()
        self._fresh_walk()

    def _fresh_walk(self) -> None:
        """:meth:`fits_now_any`'s chunk cache, empty."""
        self._ck: tuple[int, int] = (0, -1)
        self._lo = self._hi = 0
        self._chunk = 8
        self._rows: list[bool | None] = []
        self._ok = np.zeros((0, self.pool.n_classes), bool)
        self._now: Summary | None = None

    def __len__(self) -> int:
        return len(self.requests)

    def rows(self, lo: int, hi: int) -> OptionBatch:
        """Jobs ``lo:hi`` as a batch of their own, equal to ``OptionBatch`` of those jobs with
        the same knobs (every row is computed from its own job alone) but without redoing the
        work: views, no copies. A replay that knows its jobs in advance builds one batch for
        all of them and hands the core one slice per tick."""
        b = OptionBatch.__new__(OptionBatch)
        for name in _ROW_ARRAYS:
            setattr(b, name, getattr(self, name)[lo:hi])
        b.requests = self.requests[lo:hi]
        b.pool, b.select = self.pool, self.select
        w = self.why_excluded
        b.why_excluded = w if isinstance(w, str) else w[lo:hi]
        b._cheapest_empty = self._cheapest_empty[lo:hi]
        b._any_empty = self._any_empty[lo:hi]
        b._exact_any = bool(b.host_exact.any())
        b._gang_rows = frozenset(g - lo for g in self._gang_rows if lo <= g < hi)
        b._ck, b._lo, b._hi, b._chunk, b._rows = (0, -1), 0, 0, 8, []
        return b

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
        t.empty_code = self.empty_code[i]
        t.fits_now = fits_empty & (now.class_supply >= self.demand[i])
        t.ask = t.request.host_ask
        t.host_exact = self.host_exact[i]
        t.host_empty = self.host_empty[i]
        t.node_ok, t.sel_ok = self.node_ok[i], self.sel_ok[i]
        if self._exact_any or now.any_tight:
            short = host_refine(
                pool, now, t.fits_now, t.host_exact, need, t.ask, t.request, t.node_ok
            )
            if short is not no_short(pool):
                t.fits_now = t.fits_now & ~short
            t.host_short = short
        else:
            t.host_short = no_short(pool)
        t.gang = self.gang[i]
        if i in self._gang_rows:
            t.fits_now = t.fits_now | self.gang_now(i, now)
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
        t._as_lists = None
        t._order = None
        return t

    def gang_now(self, i: int, now: Summary) -> np.ndarray:
        """Per class, whether job ``i``'s multi-node gang fits ``now`` (False off gang classes)."""
        out = np.zeros(self.pool.n_classes, bool)
        free = gang_free(now.node_free, self.node_ok[i])
        for c in np.flatnonzero(self.gang[i] & self.fits_empty[i]).tolist():
            out[c] = (
                plan_gang(
                    self.pool,
                    c,
                    int(self.n_gpus[i]),
                    int(self.tensor_parallel[i]),
                    int(self.need_mib[i, c]),
                    self.requests[i].host_ask,
                    free,
                    now.node_cpu_free,
                    now.node_host_free,
                )
                is not None
            )
        return out

    def ask(self, i: int) -> HostAsk:
        """Job ``i``'s host ask (millicores, MiB, predicted floor)."""
        return self.requests[i].host_ask

    def fits_empty_any(self, i: int) -> bool:
        return self._any_empty[i]

    def fits_now_any(self, i: int, state: PoolState) -> bool:
        """Whether any option of job ``i`` fits ``state`` now, answered for runs of jobs.

        While the state does not change (a saturated pool, a long queue) the answer for the
        next jobs comes from one (rows, classes) comparison, in chunks that double in size.
        A row that needs the per-node host check (or a gang plan) gets it only when asked: a
        placement changes the state, and the rest of its chunk is then compared again.
        """
        key = (id(state), state.version)
        if key != self._ck or not self._lo <= i < self._hi:
            self._chunk = 8 if key != self._ck else min(self._chunk * 2, 8192)
            hi = min(len(self.requests), i + self._chunk)
            now = state.summary()
            ok = self.fits_empty[i:hi] & (now.class_supply >= self.demand[i:hi])
            # Rows that fit on a class needing no per-node host check are settled; the others
            # are checked node by node.
            if self._exact_any or now.any_tight:
                sure = ok & ~(self.host_exact[i:hi] | now.class_tight[None, :])
            else:
                sure = ok
            rows: list[bool | None] = sure.any(axis=1).tolist()
            for r in np.flatnonzero(~sure.any(axis=1) & ok.any(axis=1)).tolist():
                rows[r] = None
            for g in self._gang_rows:
                if i <= g < hi and not rows[g - i]:
                    rows[g - i] = None
            self._rows, self._ok, self._now = rows, ok, now
            self._ck, self._lo, self._hi = key, i, hi
        r = i - self._lo
        got = self._rows[r]
        if got is None:
            assert self._now is not None
            got = self._settle(i, self._ok[r], self._now)
            self._rows[r] = got
        return got

    def _settle(self, i: int, ok: np.ndarray, now: Summary) -> bool:
        """Row ``i``'s answer past the class-supply comparison: the per-node host check of the
        classes that need it, then a multi-node gang plan."""
        fits = False
        if ok.any():
            short = host_refine(
                self.pool,
                now,
                ok,
                self.host_exact[i],
                self.need_mib[i],
                self.ask(i),
                self.requests[i],
                self.node_ok[i],
            )
            fits = bool((ok & ~short).any())
        if not fits and i in self._gang_rows:
            fits = bool(self.gang_now(i, now).any())
        return fits

    def fit_key(self, i: int) -> tuple[Any, ...]:
        """A key equal for two rows of this batch exactly when "fits now" reads the same
        figures for both (sizes, demands, the host ask and gang layout), so they get the
        same answer on any state. "Fits now" only gets harder as a state takes allocations,
        so a row that did not fit a state fits none of its later versions that only added
        allocations: a queue walk asks once per key, not once per job."""
        r = self.requests[i]
        return (
            self.need_mib[i].tobytes(),
            self.demand[i].tobytes(),
            self.fits_empty[i].tobytes(),
            self.host_exact[i].tobytes(),
            self.gang[i].tobytes(),
            r.host_ask,
            r.n_gpus,
            r.tensor_parallel,
        )


def _gang_empty(
    pool: Pool,
    empty_state: PoolState | None,
    empty: Summary,
    c: int,
    r: PlacementRequest,
    need_mib: int,
    node_ok: np.ndarray | None,
) -> tuple[bool, float, float]:
    """Whether a gang of class ``c`` fits the empty pool (on the nodes in ``node_ok``, None:
    any), and the (already charged, gang) inter-node seconds of its runtime; cached per pool
    (a queued gang is re-enumerated every tick, and none of this depends on the state)."""
    key = (c, r.n_gpus, r.tensor_parallel, need_mib, r.host_ask, r.sync, r.node_selector)
    cache: dict[Any, tuple[bool, float, float]] = pool._empty.setdefault("gang_empty", {})
    got = cache.get(key) if empty_state is None else None
    if got is None:
        plan = plan_gang(
            pool,
            c,
            r.n_gpus,
            r.tensor_parallel,
            need_mib,
            r.host_ask,
            gang_free(empty.node_free, node_ok),
            empty.node_cpu_free,
            empty.node_host_free,
        )
        charged, net = gang_network_s(pool, c, r.n_gpus, r.tensor_parallel, r.sync)
        got = (plan is not None, charged, net)
        if empty_state is None:
            if len(cache) > 65536:
                cache.clear()
            cache[key] = got
    return got


def _class_max_shared(pool: Pool) -> np.ndarray:
    """Per option class, the most jobs one of its shared GPUs admits (1 for other classes):
    the smallest compute-share floor a node of the class promises."""
    cached = pool._empty.get("class_max_shared")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    out = np.ones(pool.n_classes)
    shared = pool.gpu_mode == KIND_SHARED
    for c in np.flatnonzero(pool.class_kind == KIND_SHARED):
        mine = shared & (pool.gpu_type == pool.class_type[c])
        if mine.any():
            out[c] = float(pool.max_shared[mine].max())
    pool._empty["class_max_shared"] = out
    return out


def _sizes(
    requests: Sequence[PlacementRequest],
    pool: Pool,
    by_kind: np.ndarray,
    reserve_whole: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per job and class: GPU count, pinned type (-1: none), MiB reserved, whether the
    prediction is finite, whether one slot holds it, and the runtime there (MPS share and
    slice speed applied). Gangs are re-priced later over their network."""
    n_jobs = len(requests)
    ct = pool.class_type
    is_whole = by_kind[KIND_WHOLE]
    is_shared = by_kind[KIND_SHARED]
    if n_jobs:
        upper = np.stack([r.vram_upper_gib for r in requests])
        rt = np.stack([r.runtime_s for r in requests])
    else:
        upper = rt = np.empty((0, N_TYPES))
    n = np.fromiter((r.n_gpus for r in requests), np.int64, n_jobs)
    floor = np.fromiter(
        (0.0 if r.reserved_gib is None else r.reserved_gib for r in requests), float, n_jobs
    )
    pin = np.fromiter(
        (-1 if r.gpu is None else TYPE_INDEX[r.gpu] for r in requests), np.int64, n_jobs
    )
    need_gib = np.maximum(upper, floor[:, None])[:, ct]
    busy = np.stack([r.busy_frac for r in requests]) if n_jobs else rt
    runtime = rt[:, ct] * (1.0 + busy[:, ct] * (pool.class_runtime_scale - 1.0))
    finite = np.isfinite(need_gib) & np.isfinite(runtime)
    # Capped far above any GPU, so a forged 1e308 GiB stays a "needs more than the slot"
    # refusal instead of overflowing the MiB cast into a negative reservation.
    need_gib = np.minimum(np.where(finite, need_gib, 0.0), _MAX_NEED_GIB)
    need = np.ceil(need_gib * MIB_PER_GIB).astype(np.int64)
    cap_ok = need <= pool.class_capacity_mib
    if reserve_whole:
        # The job must still fit; it then holds the whole GPU, as users do today.
        need = np.where(is_whole & cap_ok, pool.class_capacity_mib, need)
    if is_shared.any():
        # On a shared GPU the job gets its compute share of the SMs (MPS active-thread
        # percentage): its saturating part stretches by 1 / share, like on a MIG slice.
        compute = shared_compute_share(need, pool.class_capacity_mib, _class_max_shared(pool))
        scale = pool.class_runtime_scale / np.where(is_shared, compute, 1.0)
        stretched = rt[:, ct] * (1.0 + busy[:, ct] * (scale - 1.0))
        runtime = np.where(is_shared, stretched, runtime)
    return n, pin, need, finite, cap_ok, runtime


def _cheapest(fits: np.ndarray, cost: np.ndarray, size_mib: np.ndarray) -> list[int]:
    """Per job, the cheapest class among ``fits`` (ties: smaller, then class order); -1: none."""
    n_jobs, k = fits.shape
    if not k:
        return [-1] * n_jobs
    masked = np.where(fits, cost, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(k), (n_jobs, k)), size_mib, masked), axis=-1)
    first = order[:, 0]
    return np.where(fits[np.arange(n_jobs), first], first, -1).tolist()


def _allowed(
    n_jobs: int,
    pool: Pool,
    types: Sequence[str] | Sequence[Sequence[str] | None] | None,
    kinds: Sequence[str] | None,
) -> np.ndarray:
    """(jobs, classes): which option classes a policy lets each job use."""
    ct = pool.class_type
    by_type, by_kind = class_masks(pool)
    allowed = np.ones((n_jobs, pool.n_classes), bool)
    if types is not None:
        if types and all(isinstance(t, str) for t in types):
            allowed &= by_type[[TYPE_INDEX[t] for t in types]].any(axis=0)  # type: ignore[index]
        else:
            rows: list[int] = []
            cols: list[int] = []
            for i, ts in enumerate(types):
                for t in GPU_NAMES if ts is None else ts:
                    rows.append(i)
                    cols.append(TYPE_INDEX[t])  # type: ignore[index]
            ok_type = np.zeros((n_jobs, N_TYPES), bool)
            ok_type[rows, cols] = True
            allowed &= ok_type[:, ct]
    if kinds is not None:
        allowed &= by_kind[[KIND_NAMES.index(x) for x in kinds]].any(axis=0)  # type: ignore[arg-type]
    return allowed


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
    **knobs: Any,
) -> list[Option]:
    """Every option class of the pool for ``request``, in the pool's class order.

    ``fits_empty`` is judged against ``empty_state`` (default: the pool with nothing running),
    ``fits_now`` against ``state``; every option that fits now is bound to the concrete GPUs
    ``select`` picks ("pack": the fullest node / GPU that still fits, "first": the lowest
    index). ``types``/``kinds`` restrict what a policy may use (others get ``why_excluded``);
    ``reserve_whole`` makes a whole-GPU option reserve the entire GPU (the user-request habit).
    These ``knobs`` are :class:`~scheduler.core.table.OptionTable`'s keywords, with its defaults.
    """
    table = OptionTable(request, state, empty_state, **knobs)
    return [
        table.option(c, table.bind(c, state) if table.fits_now[c] else None)
        for c in range(len(table))
    ]
