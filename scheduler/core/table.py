"""One job's options at one moment, as arrays over the pool's option classes: rank, explain,
bind."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core._classes import class_masks, gib, node_max_size, opt_float
from scheduler.core.binding import Binding, Select, bind, bind_gang, shared_gpu
from scheduler.core.decision import Option
from scheduler.core.gang import GangPlan, gang_reason, node_ask, plan_gang
from scheduler.core.host import (
    HostAsk,
    demand,
    demand_at,
    fit_nodes,
    gpu_nodes_empty,
    gpu_nodes_now,
    host_reason,
)
from scheduler.core.pool import (
    KIND_MIG,
    KIND_NAMES,
    KIND_SHARED,
    KIND_WHOLE,
    MIB_PER_GIB,
    MILLI_PER_CPU,
    Pool,
)
from scheduler.core.reasons import REASON_TOO_SMALL, costlier_reason, too_small_reason
from scheduler.core.requests import PlacementRequest
from scheduler.core.selector import gang_free, selector_busy_reason, selector_reason
from scheduler.core.state import PoolState, Summary
from scheduler.core.table_columns import (
    busy_reason,
    pool_columns,
    table_columns,
    table_columns_json,
)
from scheduler.exceptions import PlacementError

__all__ = ["LoserRule", "OptionTable"]


@dataclass(frozen=True, slots=True)
class LoserRule:
    """What each option that fits now but lost says in a Decision: ``override`` when set (a
    pending job's reason, for all of them); else, with ``by_cost``, how much more it costs than
    the chosen one (from half a cent up); else ``reason``."""

    reason: str = "ranked lower by this policy"
    by_cost: bool = True
    override: str | None = None


_RANKED = LoserRule()


class OptionTable:
    """Every option class of the pool for one job at one moment, as arrays over classes.

    This is the hot-path form of :func:`enumerate_options` (same arguments): policies rank
    options with numpy and bind concrete GPUs only for the one they choose; :meth:`options`
    builds the :class:`~scheduler.core.decision.Option` list for the placement log when someone
    reads it. Every array is computed up front, so a table stays valid after the state moves
    on. Many jobs at once: :class:`OptionBatch`.
    """

    __slots__ = (
        "_as_lists",
        "_first",
        "_leftover",
        "_order",
        "_state",
        "allowed",
        "ask",
        "cap_ok",
        "capacity_mib",
        "cheapest_empty",
        "cost",
        "empty_code",
        "empty_room",
        "finite",
        "fits_empty",
        "fits_now",
        "gang",
        "host_empty",
        "host_exact",
        "host_short",
        "kind_ok",
        "need_mib",
        "node_ok",
        "now",
        "pinned_ok",
        "pool",
        "request",
        "runtime",
        "sel_ok",
        "select",
        "size",
        "why_excluded",
    )

    allowed: np.ndarray
    ask: HostAsk
    cap_ok: np.ndarray
    capacity_mib: np.ndarray
    cheapest_empty: int | None
    cost: np.ndarray
    # Per class, its reason code where it does not fit now, as far as the pool alone says
    # (scheduler.core.table_columns.empty_codes).
    empty_code: np.ndarray
    empty_room: np.ndarray
    finite: np.ndarray
    fits_empty: np.ndarray
    fits_now: np.ndarray
    # Per class, whether the job is a multi-node gang there (scheduler.core.gang).
    gang: np.ndarray
    # Host resources: per class, whether the job asks more than its share somewhere (so the
    # per-node check applies), fits some node's CPUs and memory at all, and lost now only on
    # them (GPUs free, CPUs or memory not).
    host_empty: np.ndarray
    host_exact: np.ndarray
    host_short: np.ndarray
    kind_ok: np.ndarray
    need_mib: np.ndarray
    # The job's node selector (scheduler.core.selector): per node whether it matches (None:
    # no selector), and per class whether a matching node can host the class at all.
    node_ok: np.ndarray | None
    now: Summary
    pinned_ok: np.ndarray
    pool: Pool
    request: PlacementRequest
    runtime: np.ndarray
    sel_ok: np.ndarray
    select: Select
    size: np.ndarray
    why_excluded: str
    _state: PoolState | None
    _leftover: np.ndarray | None
    _first: np.ndarray | None
    # The last ranking of ``fits_now`` (the mask, keys and order), for runner_up.
    _order: tuple[np.ndarray, Callable[..., Any], np.ndarray] | None
    _as_lists: tuple[list[Any], ...] | None

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
        from scheduler.core.options import OptionBatch

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
            shared_now = self.fits_now & class_masks(pool)[1][KIND_SHARED]
            if np.count_nonzero(shared_now):
                state = self._need_state("leftover()")
                for c in shared_now.nonzero()[0]:
                    need = int(self.need_mib[c])
                    nodes = self.host_nodes(int(c), state)
                    g = shared_gpu(pool, state, int(pool.class_type[c]), need, self.select, nodes)
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
                    if self.gang[c]:
                        # A multi-node gang: its plan's rendezvous node comes first.
                        first[c] = self.bind(int(c), state).gpus[0]
                        continue
                    nodes = self.host_nodes(int(c), state)
                    b = bind(self.pool, state, int(c), n, int(self.need_mib[c]), "first", nodes)
                    first[c] = b.gpus[0]
            self._first = first
        return self._first

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.fits_now.shape[0])

    def size_mib(self) -> np.ndarray:
        """Memory the option occupies across all its GPUs (ties go to the smallest)."""
        return self.size

    def best(self, keys: Sequence[np.ndarray], mask: np.ndarray) -> int | None:
        """Index minimising ``keys`` (lexsort order: last key is primary) among ``mask``."""
        return self.best_of(self.ranked(keys, mask), mask)

    def best_by(self, keys: Callable[[OptionTable], Sequence[np.ndarray]]) -> int | None:
        """:meth:`best` of ``keys(self)`` among what fits now, its ordering kept for
        :meth:`runner_up` (the commit reads the runner-up from it: no second sort, and the
        keys as they were before the winner was allocated)."""
        order = self.ranked(keys(self), self.fits_now)
        self._order = (self.fits_now, keys, order)
        return self.best_of(order, self.fits_now)

    @staticmethod
    def ranked(keys: Sequence[np.ndarray], mask: np.ndarray) -> np.ndarray:
        """Every class, ``mask``'s first, each group by ``keys`` (ties keep class order)."""
        # Masked-out classes sort last on an extra, most significant key.
        return np.lexsort((*keys, ~mask))

    @staticmethod
    def best_of(order: np.ndarray, mask: np.ndarray) -> int | None:
        """:meth:`best` from :meth:`ranked`'s order."""
        c = int(order[0])
        return c if mask[c] else None

    def runner_up(
        self, keys: Callable[[OptionTable], Sequence[np.ndarray]], chosen: int
    ) -> int | None:
        """``best(keys(self), fits_now without chosen)``. Where ``chosen`` is what
        :meth:`best_by` with the same ``keys`` answered, the next class of that ordering (the
        sort is stable, so taking the winner out moves no other class)."""
        got = self._order
        if (
            got is not None
            and got[0] is self.fits_now
            and got[1] == keys
            and int(got[2][0]) == chosen
            and self.fits_now[chosen]
        ):
            order = got[2]
            if len(order) < 2:
                return None
            r = int(order[1])
            return r if self.fits_now[r] else None
        others = self.fits_now.copy()
        others[chosen] = False
        return self.best(keys(self), others)

    def cost_keys(self) -> tuple[np.ndarray, ...]:
        return (self.size_mib(), self.cost)

    def cheapest(self, *, now: bool = True) -> int | None:
        if not now:
            return self.cheapest_empty
        return self.best_by(OptionTable.cost_keys)

    def _lists(self) -> tuple[list[Any], ...]:
        """The per-class arrays :meth:`reason` reads, as lists (read once per table: a stored
        decision explains every class, and numpy scalar reads dominated that)."""
        if self._as_lists is None:
            pool = self.pool
            self._as_lists = tuple(
                a.tolist()
                for a in (
                    self.fits_now,
                    pool.class_type,
                    pool.class_kind,
                    self.need_mib,
                    self.finite,
                    self.pinned_ok,
                    self.allowed,
                    self.kind_ok,
                    self.cap_ok,
                    self.gang,
                    self.empty_room,
                    self.host_empty,
                    self.host_short,
                    self.sel_ok,
                )
            )
        return self._as_lists

    def reason(self, c: int) -> str:
        """Why class ``c`` cannot run this job now ("" when it can)."""
        why = self._why(c)
        if why == REASON_TOO_SMALL:
            slot = pool_columns(self.pool)["slot_name"][c]
            need, cap = gib(int(self.need_mib[c])), gib(int(self.capacity_mib[c]))
            return too_small_reason(slot, need, cap)
        return str(why)

    def _why(self, c: int) -> str | int:
        """:meth:`reason`, with a reason its row's columns word kept as its code
        (:mod:`scheduler.core.reasons`)."""
        (fits, ctype, ckind, need_mib, finite, pinned, allowed, kind_ok, cap_ok, gang, room,
         host_empty, host_short, sel_ok) = self._lists()  # fmt: skip
        if fits[c]:
            return ""
        pool = self.pool
        t = ctype[c]
        tname = GPU_NAMES[t]
        kind = ckind[c]
        profile = pool.class_profile[c]
        n = self.request.n_gpus
        need = need_mib[c]
        if not finite[c]:
            return f"{tname}: no prediction for this GPU type"
        if not pinned[c]:
            return f"pinned to {self.request.gpu}"
        if not allowed[c]:
            return self.why_excluded
        if not kind_ok[c]:
            what = f"MIG {profile}" if kind == KIND_MIG else f"shared {tname}"
            return f"{what}: takes 1-GPU jobs only (job needs {n})"
        if not cap_ok[c]:
            return REASON_TOO_SMALL
        if not sel_ok[c]:
            return selector_reason(pool, c, self.request)
        if gang[c]:
            return self._gang_reason(c, empty=not room[c])
        if not room[c]:
            if kind == KIND_WHOLE:
                largest = int(node_max_size(pool)[t])
                return (
                    f"{tname}: needs {n} GPUs in one node; the largest {tname} node has {largest}"
                )
            if kind == KIND_MIG:
                return f"{tname} MIG {profile}: no such slice in this pool"
            return f"shared {tname}: no shared GPU has {gib(need):.1f} GiB"
        sel = self.node_ok
        if not host_empty[c]:
            cpu, host = demand(pool, c, n, self.ask, need)
            nodes = (
                gpu_nodes_empty(pool, c, n) if sel is None else gpu_nodes_empty(pool, c, n) & sel
            )
            return host_reason(
                pool, c, cpu, host, pool.node_cpu_milli, pool.node_host_mib, nodes, empty=True
            )
        if host_short[c]:
            cpu, host = demand(pool, c, n, self.ask, need)
            nodes = gpu_nodes_now(pool, self.now, c, n, need)
            if sel is not None:
                nodes = nodes & sel
                if not nodes.any():
                    return f"{pool.class_label(c)}: {selector_busy_reason(self.request)}"
            why = host_reason(
                pool,
                c,
                cpu,
                host,
                self.now.node_cpu_free,
                self.now.node_host_free,
                nodes,
                empty=False,
            )
            return f"{pool.class_label(c)}: {why}"
        return busy_reason(self, c)

    def _gang_reason(self, c: int, *, empty: bool) -> str:
        pool = self.pool
        if empty:
            free, cpu, host = pool.node_count, pool.node_cpu_milli, pool.node_host_mib
        else:
            free, cpu, host = self.now.node_free, self.now.node_cpu_free, self.now.node_host_free
        free = gang_free(free, self.node_ok)
        r = self.request
        return gang_reason(
            pool,
            c,
            r.n_gpus,
            r.tensor_parallel,
            int(self.need_mib[c]),
            self.ask,
            free,
            cpu,
            host,
            empty=empty,
        )

    def gang_plan(self, c: int, state: PoolState) -> GangPlan | None:
        """Class ``c``'s multi-node plan on ``state`` (None: not a gang class, or no fit)."""
        if not self.gang[c]:
            return None
        now = state.summary()
        r = self.request
        return plan_gang(
            self.pool,
            c,
            r.n_gpus,
            r.tensor_parallel,
            int(self.need_mib[c]),
            self.ask,
            gang_free(now.node_free, self.node_ok),
            now.node_cpu_free,
            now.node_host_free,
            self.select,
        )

    # -- binding and materialising -----------------------------------------------------------

    def bind(self, c: int, state: PoolState) -> Binding:
        """Concrete GPUs for class ``c`` on ``state`` (which must be the table's state)."""
        if not self.fits_now[c]:
            raise PlacementError(
                f"job {self.request.job_id!r}: option {self.pool.class_label(c)} does not fit "
                f"now ({self.reason(c)})"
            )
        if self.gang[c]:
            plan = self.gang_plan(c, state)
            if plan is None:
                raise PlacementError(
                    f"job {self.request.job_id!r}: gang {self.pool.class_label(c)} does not fit "
                    "this state; bind on the state the table was built for"
                )
            return bind_gang(self.pool, state, plan, int(self.capacity_mib[c]))
        nodes = self.host_nodes(c, state)
        return bind(
            self.pool, state, c, self.request.n_gpus, int(self.need_mib[c]), self.select, nodes
        )

    def host_nodes(self, c: int, state: PoolState) -> np.ndarray | None:
        """Per node, where class ``c`` fits the job's CPUs and host memory on ``state`` now;
        None where every node whose GPUs fit also has them (no per-node check needed)."""
        now = state.summary()
        if not (self.host_exact[c] or now.class_tight[c]):
            return None
        n = self.request.n_gpus
        fit = fit_nodes(self.pool, now, c, n, int(self.need_mib[c]), self.ask)
        return fit if self.node_ok is None else fit & self.node_ok

    def option(self, c: int, binding: Binding | None = None, reason: str | None = None) -> Option:
        pool = self.pool
        t = int(pool.class_type[c])
        kind = int(pool.class_kind[c])
        vram = float(self.request.vram_gib[t])
        upper = float(self.request.vram_upper_gib[t])
        need = int(self.need_mib[c])
        leftover: float | None = None
        cpus: float | None = None
        host: float | None = None
        n_nodes = 1
        if binding is not None:
            leftover = gib(binding.free_before_mib - need)
            k = int(pool.gpu_node[binding.gpus[0]])
            n_nodes = binding.n_nodes
            # A gang's figures are per node: what each of its nodes gives its share.
            per_node = self.request.n_gpus // n_nodes
            ask = node_ask(self.ask, n_nodes) if n_nodes > 1 else self.ask
            cpu_m, host_m = demand_at(pool, c, per_node, ask, k, need)
            cpus, host = cpu_m / MILLI_PER_CPU, host_m / MIB_PER_GIB
        return Option(
            kind=KIND_NAMES[kind],
            gpu_type=GPU_NAMES[t],
            node=binding.node if binding is not None else None,
            gpu_indices=binding.gpus if binding is not None else (),
            mig_profile=pool.class_profile[c],
            n_gpus=self.request.n_gpus if kind == KIND_WHOLE else 1,
            capacity_gib=gib(int(self.capacity_mib[c])),
            reserved_gib=gib(need),
            vram_gib=vram if math.isfinite(vram) else None,
            vram_upper_gib=upper if math.isfinite(upper) else None,
            runtime_s=opt_float(float(self.runtime[c])),
            cost_usd=opt_float(float(self.cost[c])),
            fits_now=bool(self.fits_now[c]),
            fits_empty=bool(self.fits_empty[c]),
            reason=self.reason(c) if reason is None else reason,
            mig_start=binding.mig_start if binding is not None else None,
            leftover_gib=leftover,
            cpus=cpus,
            host_memory_gib=host,
            n_nodes=n_nodes,
        )

    def loser_reason(self, c: int, chosen: int | None = None, rule: LoserRule = _RANKED) -> str:
        """What option ``c``'s record says when ``chosen`` won (:meth:`options`' reasons)."""
        if not self.fits_now[c]:
            return self.reason(c)
        if rule.override is not None:
            return rule.override
        if chosen is None:
            return ""
        extra = float(self.cost[c]) - float(self.cost[chosen])
        if rule.by_cost and extra >= 0.005:
            return costlier_reason(extra)
        return rule.reason

    def options(
        self,
        chosen: int | None = None,
        chosen_option: Option | None = None,
        rule: LoserRule = _RANKED,
    ) -> list[Option]:
        """The Option list for a Decision; feasible losers say why the chosen one beat them."""
        out: list[Option] = []
        for c in range(len(self)):
            if c == chosen and chosen_option is not None:
                out.append(chosen_option)
                continue
            out.append(self.option(c, reason=self.loser_reason(c, chosen, rule)))
        return out

    def columns(
        self,
        chosen: int | None = None,
        chosen_option: Option | None = None,
        rule: LoserRule = _RANKED,
    ) -> dict[str, Any]:
        """:meth:`options` as the compact decision's ``option_columns``, built from the arrays
        (:func:`~scheduler.core.table_columns.table_columns`): the service stores one of these
        per placed job, thousands per second."""
        return table_columns(self, chosen, chosen_option, rule)

    def columns_json(
        self,
        chosen: int | None = None,
        chosen_option: Option | None = None,
        rule: LoserRule = _RANKED,
    ) -> bytes:
        """:meth:`columns` as orjson writes them (what the service stores), byte for byte."""
        return table_columns_json(self, chosen, chosen_option, rule)
