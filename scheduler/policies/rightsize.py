"""``rightsize``: the cheapest option that really fits now, with backfill.

Every option is sized by the predicted upper VRAM bound, so a small job lands on a MIG slice, a
shared GPU or a small card instead of a whole big one. With ``wait_for_cheaper`` a job whose
cheaper option is busy waits for it when running jobs' predicted ends say it frees up in time
(before the job's deadline, or within ``max_wait_s`` when it has none). A job that cannot start
gets a reservation at its earliest predicted start; later jobs backfill only if they end before
it or stay off its GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision, Option
from ..exceptions import PolicyError
from ..placement import (
    OptionTable,
    PlacementRequest,
    RunningJob,
    earliest_fit,
    greedy_schedule,
)
from ..pool import PoolState
from .base import Policy
from .registry import PolicyName

__all__ = ["RightSizePolicy"]


class RightSizePolicy(Policy):
    name = PolicyName.RIGHTSIZE

    def __init__(
        self,
        *,
        backfill: bool = True,
        wait_for_cheaper: bool = False,
        max_wait_s: float = 1800.0,
        min_saving: float = 0.10,
    ) -> None:
        if max_wait_s < 0 or not 0 <= min_saving < 1:
            raise PolicyError(
                f"rightsize: max_wait_s must be >= 0 and min_saving in [0, 1); got "
                f"max_wait_s={max_wait_s}, min_saving={min_saving}"
            )
        self.backfill = backfill
        self.wait_for_cheaper = wait_for_cheaper
        self.max_wait_s = float(max_wait_s)
        self.min_saving = float(min_saving)

    def schedule(
        self,
        pending: Sequence[PlacementRequest],
        state: PoolState,
        now_s: float,
        running: Sequence[RunningJob] = (),
    ) -> list[Decision]:
        return greedy_schedule(
            pending,
            state,
            now_s,
            running,
            policy=self.name.value,
            chosen_reason=lambda o: (
                f"cheapest option that fits now: {o.label} at ${o.cost_usd:.2f}"
            ),
            backfill=self.backfill,
            wait_hook=self._wait if self.wait_for_cheaper else None,
        )

    def _wait(
        self,
        table: OptionTable,
        idx: int,
        state: PoolState,
        running: Sequence[RunningJob],
        now_s: float,
    ) -> tuple[str, float, Option] | None:
        req = table.request
        now_cost = float(table.cost[idx])
        target = now_cost * (1.0 - self.min_saving)
        best = table.best(table.cost_keys(), table.fits_empty & (table.cost < target))
        if best is None:
            return None

        def cheaper(s: PoolState) -> tuple[OptionTable, int | None]:
            t = OptionTable(req, s)
            return t, t.best(t.cost_keys(), t.fits_now & (t.cost < target))

        found = earliest_fit(state, running, now_s, cheaper)
        if found is None:
            return None
        t, option = found
        runtime = option.runtime_s or 0.0
        deadline = req.deadline_at_s
        if deadline is not None:
            if t + runtime > deadline:
                return None
        elif t - now_s > self.max_wait_s:
            return None
        return (
            f"waiting for {option.label} (${option.cost_usd:.2f} vs ${now_cost:.2f} now), "
            f"predicted free at t={t:.0f}s",
            t,
            option,
        )
