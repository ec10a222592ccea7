"""The queue loop of the policies that score each job's options on their own (``fgd`` and the
node scorers): in queue order, a job that fits nowhere even on an empty pool is rejected, one the
policy finds nothing for now waits, and any other is placed on the policy's pick before the next
job is looked at. Jobs that cannot start do not block later ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler.core.binding import Binding
from scheduler.core.decide import pending_decision, place, rejected_decision
from scheduler.core.decision import Decision
from scheduler.core.options import OptionBatch
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.core.table import OptionTable
from scheduler.policies.base import Tick

__all__ = ["Pick", "place_each"]

#: A policy's choice for one job: (option class, its binding, the placement log's reason).
Pick = tuple[int, Binding, str]


def place_each(
    tick: Tick,
    policy: str,
    pick: Callable[[OptionTable], Pick | None],
    loser_reason: str,
    *,
    batch_check: bool = False,
    placed: Callable[[OptionTable, Binding], None] | None = None,
) -> list[Decision]:
    """One Decision per job of ``tick``, in order; ``pick`` sees the job's table against the
    state as earlier jobs left it. ``batch_check`` first asks the batch whether anything fits
    now (cheap for runs of jobs while the state stands still); ``placed`` runs after each
    placement (a policy's own incremental bookkeeping). Losers that fit say ``loser_reason``."""
    pending, state, now_s = tick.pending, tick.state, tick.now_s
    batch = tick.batch
    if batch is None or not _covers(batch, pending, state):
        batch = OptionBatch(pending, state.pool)
    out: list[Decision] = []
    for i in range(len(pending)):
        if not batch.fits_empty_any(i):
            out.append(rejected_decision(batch.table(i, state), policy=policy, now_s=now_s))
            continue
        if batch_check and not batch.fits_now_any(i, state):
            out.append(pending_decision(batch.table(i, state), policy=policy, now_s=now_s))
            continue
        # The table says what fits now (GPUs and host).
        table = batch.table(i, state)
        choice = pick(table) if table.fits_now.any() else None
        if choice is None:
            out.append(pending_decision(table, policy=policy, now_s=now_s))
            continue
        c, binding, reason = choice
        d = place(
            table,
            c,
            state,
            policy=policy,
            now_s=now_s,
            reason=reason,
            loser_reason=loser_reason,
            by_cost=False,
            binding=binding,
        )
        if placed is not None:
            placed(table, binding)
        out.append(d)
    return out


def _covers(batch: OptionBatch, pending: Sequence[PlacementRequest], state: PoolState) -> bool:
    """Whether ``batch`` was built for exactly ``pending`` (the same objects, in order) on
    ``state``'s pool, so its rows are the jobs' own."""
    if batch.pool is not state.pool or len(batch.requests) != len(pending):
        return False
    return all(a is b for a, b in zip(batch.requests, pending, strict=True))
