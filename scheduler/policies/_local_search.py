"""rightsize's local search on a placed window of the queue: move a job to a cheaper free
option, or swap it with a holder of its cheapest option when the pair then costs less."""

from __future__ import annotations

from predictor.gpus import GPU_NAMES
from scheduler.core.decide import place
from scheduler.core.decision import Decision, Option
from scheduler.core.options import OptionBatch
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.core.table import OptionTable

__all__ = ["LocalSearch"]

#: How many holders of a job's cheapest class a swap tries.
_MAX_SWAP_PARTNERS = 8
#: Passes over the window (the second only when the first moved something).
_PASSES = 2


class LocalSearch:
    """Improves ``decisions`` of the ``placed`` jobs on ``trial`` in place (see :meth:`run`)."""

    def __init__(
        self,
        requests: dict[str, PlacementRequest],
        decisions: dict[str, Decision],
        placed: set[str],
        trial: PoolState,
    ) -> None:
        self.decisions = decisions
        self.placed = placed
        self.trial = trial
        self.pool = trial.pool
        # One batch for the window (what OptionTable(request, trial) sizes, row by row).
        jobs = sorted(placed)
        self.batch = OptionBatch([requests[j] for j in jobs], self.pool)
        self.row = {j: i for i, j in enumerate(jobs)}
        self.policy = ""
        self.now_s = 0.0

    def run(self, policy: str, now_s: float) -> bool:
        """Up to two passes, dearest job first; whether anything moved."""
        self.policy, self.now_s = policy, now_s
        moved = False
        for _ in range(_PASSES):
            changed = False
            for job in sorted(self.placed, key=lambda j: (-self.cost_of(j), j)):
                changed |= self.improve(job)
            moved = moved or changed
            if not changed:
                break
        return moved

    def improve(self, job: str) -> bool:
        """Move ``job`` to a cheaper option that fits now, else swap it onto its cheapest
        class; whether it moved (else ``trial`` is as before)."""
        trial = self.trial
        old = trial.option_of(job)
        old_cost = old.cost_usd or 0.0
        trial.release(job)
        table = self.table_of(job)
        c = table.cheapest()
        if c is not None and float(table.cost[c]) < old_cost - 1e-9:
            d = self.put(job)
            assert d is not None
            self.decisions[job] = d
            return True
        target = table.cheapest_empty
        if (
            target is not None
            and float(table.cost[target]) < old_cost - 1e-9
            and self.swap(job, old_cost, target)
        ):
            return True
        trial.allocate(old, job)
        return False

    def swap(self, job: str, old_cost: float, target: int) -> bool:
        """With ``job`` released: give it a holder's option of class ``target`` and re-place
        the holder, when the pair then costs less; whether a swap was made."""
        trial = self.trial
        holders = [
            h
            for h in sorted(self.placed)
            if h != job and _class_of(self.pool, trial.option_of(h)) == target
        ][:_MAX_SWAP_PARTNERS]
        for h in holders:
            h_old = trial.option_of(h)
            trial.release(h)
            dj = self.put(job)
            if dj is not None:
                dh = self.put(h)
                if dh is not None:
                    new = self.cost_of(job) + self.cost_of(h)
                    if new < old_cost + (h_old.cost_usd or 0.0) - 1e-9:
                        self.decisions[job], self.decisions[h] = dj, dh
                        return True
                    trial.release(h)
                trial.release(job)
            trial.allocate(h_old, h)
        return False

    def table_of(self, job: str) -> OptionTable:
        return self.batch.table(self.row[job], self.trial)

    def cost_of(self, job: str) -> float:
        return self.trial.option_of(job).cost_usd or 0.0

    def put(self, job: str) -> Decision | None:
        """Place ``job`` on its cheapest option that fits ``trial`` now; None when none does."""
        table = self.table_of(job)
        c = table.cheapest()
        if c is None:
            return None
        return place(
            table,
            c,
            self.trial,
            policy=self.policy,
            now_s=self.now_s,
            reason=(
                f"cheapest option that fits now: {self.pool.class_label(c)} at "
                f"${float(table.cost[c]):.2f} (after repacking the queue head)"
            ),
        )


def _class_of(pool: Pool, option: Option) -> int:
    """The pool's option class an Option belongs to."""
    key = (option.kind, option.gpu_type, option.mig_profile)
    cache = pool._empty.setdefault("class_by_key", {})
    if not cache:
        for c in range(pool.n_classes):
            kind = ("whole", "mig", "shared")[int(pool.class_kind[c])]
            cache[(kind, GPU_NAMES[int(pool.class_type[c])], pool.class_profile[c])] = c
    return int(cache[key])
