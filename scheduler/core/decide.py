"""Choosing and recording: a chosen option becomes a ``placed`` Decision; a job that waits or
fits nowhere gets a ``pending`` or ``rejected`` one, with reasons built only when read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.core.binding import Binding
from scheduler.core.decision import Decision, Option
from scheduler.core.state import PoolState, Summary
from scheduler.core.table import LoserRule, OptionTable

if TYPE_CHECKING:
    from scheduler.core.options import OptionBatch

__all__ = [
    "Keys",
    "cheapest_index",
    "pending_decision",
    "pending_from_batch",
    "place",
    "rejected_decision",
]


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
    """Bind ``chosen`` on ``state``, commit it, and return the ``placed`` Decision (the
    runner-up read from the table's :meth:`~OptionTable.best_by` ordering when it has one
    for ``keys``)."""
    b = binding if binding is not None else table.bind(chosen, state)
    opt = table.option(chosen, b, reason="")
    state.allocate(opt, table.request.job_id)
    runner = table.runner_up(keys, chosen)

    lazy = _PlacedThunks(table, chosen, opt, LoserRule(loser_reason, by_cost))
    return Decision(
        table.request.job_id,
        policy,
        "placed",
        chosen=chosen,
        reason=reason,
        runner_up=runner,
        time_s=now_s,
        options_thunk=lazy.options,
        committed=opt,
        option_thunk=lazy.option,
        columns_thunk=lazy.columns,
        columns_json_thunk=lazy.columns_json,
    )


@dataclass(slots=True, eq=False)
class _PlacedThunks:
    """A placed Decision's options, one option, or their columns, built only when read."""

    table: OptionTable
    chosen: int
    opt: Option
    rule: LoserRule

    def options(self) -> list[Option]:
        return self.table.options(self.chosen, self.opt, self.rule)

    def option(self, c: int) -> Option:
        if c == self.chosen:
            return self.opt
        return self.table.option(c, reason=self.table.loser_reason(c, self.chosen, self.rule))

    def columns(self) -> dict[str, list[Any]]:
        return self.table.columns(self.chosen, self.opt, self.rule)

    def columns_json(self) -> tuple[int, bytes]:
        return len(self.table), self.table.columns_json(self.chosen, self.opt, self.rule)


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


def pending_from_batch(
    batch: OptionBatch,
    i: int,
    state: PoolState,
    *,
    policy: str,
    now_s: float,
    reason: str | None = None,
) -> Decision:
    """A ``pending`` Decision for job ``i`` of ``batch`` whose table is built only when read."""
    thunks = _PendingThunks(None, batch, i, state.summary(), reason, None)
    return _lazy_pending(thunks, batch.requests[i].job_id, policy, now_s)


@dataclass(slots=True, eq=False)
class _PendingThunks:
    """Builds a pending Decision's option table, reason and options only when read.

    Pending decisions are made for every queued job on every tick; one small object per job
    (instead of closures) keeps that cheap.
    """

    table: OptionTable | None
    batch: OptionBatch | None
    i: int
    now: Summary | None
    reason: str | None
    loser_reason: str | None

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
        return self.get().options(rule=LoserRule(override=self.loser_reason or self.reason))


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
