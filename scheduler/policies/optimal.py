"""``optimal``: an exact integer program over a small batch, the reference for ``rightsize``.

It places as many of the pending jobs as the free capacity allows (first priority) at the
least total cost (second), over every concrete slot: each whole-GPU node with enough idle GPUs,
each open shared GPU (memory and job-count knapsacks), and each free MIG instance (slice
bitmasks may not overlap), within each node's free CPUs and host memory. A multi-node gang has
one column, the core's plan for it (:mod:`scheduler.core.gang`), which takes its share on each
of its nodes. Solved with HiGHS.
It is exponential in the worst case, so batches over ``max_jobs`` jobs or pools over
``max_gpus`` GPUs are refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.core.binding import Binding
from scheduler.core.decide import pending_decision, place, rejected_decision
from scheduler.core.decision import Decision
from scheduler.core.gang import GangPlan, node_ask
from scheduler.core.host import demand_at
from scheduler.core.options import OptionBatch
from scheduler.core.pool import KIND_MIG, KIND_SHARED, KIND_WHOLE, MODE_SHARED, MODE_WHOLE, Pool
from scheduler.core.state import PoolState, Summary
from scheduler.core.table import OptionTable
from scheduler.exceptions import PolicyError
from scheduler.policies.base import Policy, Tick
from scheduler.policies.registry import PolicyName

__all__ = ["OptimalPolicy"]


class OptimalPolicy(Policy):
    name = PolicyName.OPTIMAL

    def __init__(
        self, *, max_jobs: int = 30, max_gpus: int = 64, time_limit_s: float = 30.0
    ) -> None:
        self.max_jobs = max_jobs
        self.max_gpus = max_gpus
        self.time_limit_s = time_limit_s

    def decide(self, tick: Tick) -> list[Decision]:
        pending, state = tick.pending, tick.state
        self._check_size(len(pending), state.pool.n_gpus)
        batch = OptionBatch(pending, state.pool)
        tables = [batch.table(i, state) for i in range(len(pending))]
        columns = _columns(tables, state)
        chosen = self._solve(state, columns) if columns.slot else {}
        node_next: dict[int, list[int]] = {}
        return [
            self._decision(table, chosen.get(j), columns.plans.get(j), state, tick.now_s, node_next)
            for j, table in enumerate(tables)
        ]

    def _check_size(self, n_jobs: int, n_gpus: int) -> None:
        """Refuse a batch the exact solve could take exponential time on."""
        if n_jobs > self.max_jobs or n_gpus > self.max_gpus:
            raise PolicyError(
                f"optimal solves at most {self.max_jobs} jobs on {self.max_gpus} GPUs; got "
                f"{n_jobs} jobs on {n_gpus} GPUs. Use it on small batches only "
                "(or raise max_jobs / max_gpus knowingly)"
            )

    def _decision(
        self,
        table: OptionTable,
        chosen: tuple[int, int] | None,
        plan: GangPlan | None,
        state: PoolState,
        now_s: float,
        node_next: dict[int, list[int]],
    ) -> Decision:
        """One job's decision from the optimum: rejected, left pending, or placed on its slot."""
        policy = self.name.value
        if not table.fits_empty.any():
            return rejected_decision(table, policy=policy, now_s=now_s)
        if chosen is None:
            return pending_decision(
                table,
                policy=policy,
                now_s=now_s,
                loser_reason="the batch optimum uses this capacity for other jobs",
            )
        pool = state.pool
        c, k = chosen
        if k == _GANG:
            assert plan is not None
            binding = _bind_gang(state, plan, int(pool.class_capacity_mib[c]), node_next)
        else:
            binding = self._bind(state, table, c, k, node_next)
        return place(
            table,
            c,
            state,
            policy=policy,
            now_s=now_s,
            reason=(
                "exact batch optimum (most jobs placed, then least total cost): "
                f"{pool.class_label(c)} at ${float(table.cost[c]):.2f}"
            ),
            loser_reason="the batch optimum needs this capacity elsewhere",
            binding=binding,
        )

    def _bind(
        self,
        state: PoolState,
        table: OptionTable,
        c: int,
        k: int,
        node_next: dict[int, list[int]],
    ) -> Binding:
        pool = state.pool
        kind = int(pool.class_kind[c])
        if kind == KIND_WHOLE:
            free = _idle(state, k, node_next)
            n = table.request.n_gpus
            gpus = tuple(free[:n])
            del free[:n]
            return Binding(gpus, pool.nodes[k].name, None, int(pool.class_capacity_mib[c]))
        if kind == KIND_SHARED:
            free_mib = int(pool.capacity_mib[k] - state.used_mib[k])
            return Binding((k,), pool.nodes[int(pool.gpu_node[k])].name, None, free_mib)
        assert kind == KIND_MIG
        g = int(pool.cand_gpu[k])
        node = pool.nodes[int(pool.gpu_node[g])].name
        return Binding((g,), node, int(pool.cand_start[k]), int(pool.class_capacity_mib[c]))

    def _solve(self, state: PoolState, columns: _Columns) -> dict[int, tuple[int, int]]:
        """Job -> (class, slot) of the optimum: most jobs placed, then least total cost."""
        import highspy

        n = len(columns.slot)
        h = _quiet_highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(self.time_limit_s))
        h.setOptionValue("mip_rel_gap", 0.0)
        h.passModel(_integer_program(_capacity_rows(state, columns), columns.cost))
        h.run()
        status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise PolicyError(
                f"optimal: HiGHS stopped with status {status} on {n} columns; shrink the batch "
                f"or raise time_limit_s (now {self.time_limit_s} s)"
            )
        x = np.asarray(h.getSolution().col_value)
        out: dict[int, tuple[int, int]] = {}
        for i in np.flatnonzero(x > 0.5).tolist():
            j, c, k = columns.slot[i]
            out[j] = (c, k)
        return out


@dataclass
class _Columns:
    """The integer program's columns, one per (job, class, slot) that fits now, in order.

    A slot is a node (whole GPUs), a GPU (shared) or a MIG candidate, or :data:`_GANG` for a
    multi-node gang's one column, whose plan is in ``plans``.
    """

    slot: list[tuple[int, int, int]] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    need_mib: list[int] = field(default_factory=list)
    # Per column: (node, millicores, host MiB, GPUs) on each node it uses.
    host: list[list[tuple[int, int, int, int]]] = field(default_factory=list)
    plans: dict[int, GangPlan] = field(default_factory=dict)  # per job with a gang column

    def add(
        self,
        slot: tuple[int, int, int],
        cost: float,
        need_mib: int,
        host: list[tuple[int, int, int, int]],
    ) -> None:
        self.slot.append(slot)
        self.cost.append(cost)
        self.need_mib.append(need_mib)
        self.host.append(host)


def _columns(tables: Sequence[OptionTable], state: PoolState) -> _Columns:
    """Every concrete slot each job's classes could take now, with its cost and host demand."""
    pool = state.pool
    s = state.summary()
    free_mib = pool.capacity_mib - state.used_mib
    out = _Columns()
    for j, table in enumerate(tables):
        n_gpus = table.request.n_gpus
        for c in np.flatnonzero(table.fits_now & np.isfinite(table.cost)).tolist():
            need = int(table.need_mib[c])
            cost = float(table.cost[c])
            if table.gang[c]:
                # A multi-node gang: one column, the core's plan (fewest racks, then nodes).
                plan = table.gang_plan(c, state)
                if plan is None:
                    continue
                out.plans[j] = plan
                ask = node_ask(table.ask, len(plan.nodes))
                host = [
                    (k, *demand_at(pool, c, plan.share, ask, k, need), plan.share)
                    for k in plan.nodes
                ]
                out.add((j, c, _GANG), cost, need, host)
                continue
            kind = int(pool.class_kind[c])
            for k in _slots(state, s, free_mib, c, n_gpus, need).tolist():
                node = _slot_node(pool, kind, k)
                cpu, host_mib = demand_at(pool, c, n_gpus, table.ask, node, need)
                out.add((j, c, k), cost, need, [(node, cpu, host_mib, n_gpus)])
    return out


def _slots(
    state: PoolState, s: Summary, free_mib: np.ndarray, c: int, n_gpus: int, need_mib: int
) -> np.ndarray:
    """Class ``c``'s slots open now: nodes with ``n_gpus`` idle GPUs (whole), shared GPUs with a
    free share and ``need_mib`` free, or free MIG candidates."""
    pool = state.pool
    kind = int(pool.class_kind[c])
    t = int(pool.class_type[c])
    if kind == KIND_WHOLE:
        return np.flatnonzero(
            (pool.node_type == t) & (pool.node_mode == MODE_WHOLE) & (s.node_free >= n_gpus)
        )
    if kind == KIND_SHARED:
        return np.flatnonzero(
            (pool.gpu_type == t)
            & (pool.gpu_mode == MODE_SHARED)
            & (state.shared_count < pool.max_shared)
            & (free_mib >= need_mib)
        )
    return np.flatnonzero((pool.cand_class == c) & s.mig_avail)


def _capacity_rows(state: PoolState, columns: _Columns) -> list[tuple[dict[int, float], float]]:
    """One row per capacity a column draws on: (coefficients by column, upper bound).

    A job is placed at most once; each node's free CPUs and host memory; each whole-GPU node's
    idle GPUs; each shared GPU's free memory and free shares; each MIG slice bit at most once.
    """
    pool = state.pool
    s = state.summary()
    groups: dict[object, tuple[dict[int, float], float]] = {}

    def row(key: object, ub: float) -> dict[int, float]:
        if key not in groups:
            groups[key] = ({}, ub)
        return groups[key][0]

    cpu_free = s.node_cpu_free
    host_free = s.node_host_free
    for i, (j, c, k) in enumerate(columns.slot):
        row(("job", j), 1.0)[i] = 1.0
        for node, cpu, host, _ in columns.host[i]:
            row(("cpu", node), float(cpu_free[node]))[i] = float(cpu)
            row(("host", node), float(host_free[node]))[i] = float(host)
        kind = int(pool.class_kind[c])
        if kind == KIND_WHOLE:
            # One node, or each node of a gang with its share.
            for node, _, _, n_gpus in columns.host[i]:
                row(("node", node), float(s.node_free[node]))[i] = float(n_gpus)
        elif kind == KIND_SHARED:
            free = float(pool.capacity_mib[k] - state.used_mib[k])
            slots = float(pool.max_shared[k] - state.shared_count[k])
            row(("mem", k), free)[i] = float(columns.need_mib[i])
            row(("count", k), slots)[i] = 1.0
        else:
            g = int(pool.cand_gpu[k])
            mask = int(pool.cand_mask[k])
            for b in range(15):
                if mask >> b & 1:
                    row(("bit", g, b), 1.0)[i] = 1.0
    return list(groups.values())


def _integer_program(rows: list[tuple[dict[int, float], float]], cost: list[float]) -> Any:
    """The HiGHS model: binary columns, ``rows`` as <= constraints (row-wise sparse), and a cost
    that places the most jobs first and spends the least second."""
    import highspy

    n = len(cost)
    # Placing one more job must beat any cost saving: weight it above the total cost.
    big = 1.0 + 2.0 * sum(cost)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(rows)
    lp.col_cost_ = np.array(cost, float) - big
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.full(len(rows), -np.inf)
    lp.row_upper_ = np.array([ub for _, ub in rows], float)
    starts = [0]
    index: list[int] = []
    value: list[float] = []
    for coeffs, _ in rows:
        for col, v in coeffs.items():
            index.append(col)
            value.append(v)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, np.int32)
    lp.a_matrix_.index_ = np.array(index, np.int32)
    lp.a_matrix_.value_ = np.array(value, float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    return lp


#: The slot of a multi-node gang's one column: the core's plan, not one node.
_GANG = -1


def _idle(state: PoolState, k: int, node_next: dict[int, list[int]]) -> list[int]:
    """Node ``k``'s idle GPUs not yet handed out in this batch (the list is consumed)."""
    if k not in node_next:
        pool = state.pool
        a = int(pool.node_first[k])
        b = a + int(pool.node_count[k])
        idle = np.flatnonzero(~state.busy[a:b] & (state.used_mib[a:b] == 0)) + a
        node_next[k] = [int(g) for g in idle]
    return node_next[k]


def _bind_gang(
    state: PoolState, plan: GangPlan, capacity_mib: int, node_next: dict[int, list[int]]
) -> Binding:
    """A gang's GPUs from the batch's remaining idle GPUs of each planned node."""
    gpus: list[int] = []
    for k in plan.nodes:
        free = _idle(state, k, node_next)
        gpus += free[: plan.share]
        del free[: plan.share]
    name = state.pool.nodes[plan.nodes[0]].name
    return Binding(tuple(gpus), name, None, capacity_mib, len(plan.nodes))


def _slot_node(pool: Pool, kind: int, k: int) -> int:
    """The node of an ILP slot: a node (whole), a GPU (shared) or a MIG candidate."""
    if kind == KIND_WHOLE:
        return k
    if kind == KIND_SHARED:
        return int(pool.gpu_node[k])
    return int(pool.gpu_node[int(pool.cand_gpu[k])])


def _quiet_highs() -> Any:
    """A HiGHS instance without its start-up banner, which would corrupt JSON on stdout."""
    import highspy

    # The banner is printed from C++ inside the constructor, before any option can be set,
    # so stdout is pointed at /dev/null at the file-descriptor level just for that call.
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)
