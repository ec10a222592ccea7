"""``rightsize``: the cheapest option that really fits now, with backfill.

Every option is sized by the predicted upper VRAM bound, so a small job lands on a MIG slice, a
shared GPU or a small card instead of a whole big one. With ``wait_for_cheaper`` a job whose
cheaper option is busy waits for it when running jobs' predicted ends say it frees up in time
(before the job's deadline, or within ``max_wait_s`` when it has none). A job that cannot start
gets a reservation at its earliest predicted start; later jobs backfill only if they end before
it or stay off its GPUs.

Cheapest-first in queue order is myopic: a small job can take the only GPU type a big job
behind it can use, or a short job the cheap shared slot a long one would save most on. So each
tick first finds the queue prefix that starts now, then re-places that prefix plus the next
``lookahead`` jobs by regret (what a job loses if it misses its cheapest option; jobs with one
option first); the repack is kept only if every prefix job still starts and more jobs start,
or the same jobs start for less (not combined with ``wait_for_cheaper``, which keeps plain
queue order). On small windows a local search then moves jobs to cheaper free options or swaps
pairs when that lowers their joint cost. The rest of the queue then proceeds as usual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.core.backfill import earliest_fit
from scheduler.core.decision import Decision, Option
from scheduler.core.options import OptionBatch
from scheduler.core.requests import PlacementRequest, RunningJob
from scheduler.core.state import PoolState
from scheduler.core.table import OptionTable
from scheduler.exceptions import PolicyError
from scheduler.policies._local_search import LocalSearch
from scheduler.policies.base import Tick
from scheduler.policies.greedy import GreedyPolicy
from scheduler.policies.registry import PolicyName

__all__ = ["RightSizePolicy"]


class RightSizePolicy(GreedyPolicy):
    name = PolicyName.RIGHTSIZE

    def __init__(
        self,
        *,
        backfill: bool = True,
        wait_for_cheaper: bool = False,
        max_wait_s: float = 1800.0,
        min_saving: float = 0.10,
        lookahead: int = 8,
        improve_max_jobs: int = 64,
        repack_max_jobs: int = 256,
    ) -> None:
        if max_wait_s < 0 or not 0 <= min_saving < 1 or lookahead < 0:
            raise PolicyError(
                f"rightsize: max_wait_s must be >= 0, min_saving in [0, 1) and lookahead >= 0; "
                f"got max_wait_s={max_wait_s}, min_saving={min_saving}, lookahead={lookahead}"
            )
        self.backfill = backfill
        self.wait_for_cheaper = wait_for_cheaper
        self.max_wait_s = float(max_wait_s)
        self.min_saving = float(min_saving)
        self.lookahead = int(lookahead)
        self.improve_max_jobs = int(improve_max_jobs)
        self.repack_max_jobs = max(2, int(repack_max_jobs))

    def chosen_reason(self, option: Option) -> str:
        return f"cheapest option that fits now: {option.label} at ${option.cost_usd:.2f}"

    def _greedy(
        self,
        tick: Tick,
        pending: Sequence[PlacementRequest],
        state: PoolState,
        *,
        backfill: bool,
        strict_fifo: bool = False,
        batch: OptionBatch | None = None,
    ) -> list[Decision]:
        """One greedy pass over ``pending`` on ``state``, at the tick's time and running jobs."""
        part = Tick(pending, state, tick.now_s, tick.running)
        return self.walk(part, backfill=backfill, strict_fifo=strict_fifo, batch=batch)

    def decide(self, tick: Tick) -> list[Decision]:
        pending, state, now_s = tick.pending, tick.state, tick.now_s
        if self.lookahead == 0 or self.wait_for_cheaper or len(pending) < 2:
            given = self.given_rows(tick, 0, len(pending))
            return self._greedy(tick, pending, state, backfill=self.backfill, batch=given)
        # A: the queue prefix that starts now, each job on its cheapest option in queue order.
        # Bursts whose prefix exceeds repack_max_jobs skip the repack (bounded extra work).
        first = state.copy()
        head = pending[: self.repack_max_jobs]
        head_batch = self.given_rows(tick, 0, len(head)) or self.batch(head, state.pool)
        a = self._greedy(tick, head, first, backfill=False, strict_fifo=True, batch=head_batch)
        n_prefix = next((k for k, d in enumerate(a) if d.state != "placed"), len(a))
        window = list(range(min(len(head), n_prefix + self.lookahead)))
        if n_prefix == len(head) and len(pending) > len(head):
            return self._continue(tick, a, first, state)
        if n_prefix == len(pending) and self._uncontended(head_batch, a, state):
            # Every job started on its cheapest option of the tick's starting state. A
            # placement only takes capacity away, so no order starts more jobs or any job
            # for less, the local search finds no cheaper move, and plain greedy with
            # backfill (every job starts: no reservation) repeats this very walk.
            state.adopt(first)
            return a
        # B: re-place that prefix plus the next few jobs in two other orders and keep the best
        # (every prefix job must still start; then most jobs started, then least cost).
        batch = OptionBatch([pending[k] for k in window], state.pool)
        regret = _regret(batch.cost, batch.fits_empty)
        n_options = batch.fits_empty.sum(axis=1)
        orders = (
            # Highest regret first: jobs that lose most by missing their cheapest option.
            sorted(range(len(window)), key=lambda k: (-regret[k], -int(batch.n_gpus[k]), k)),
            # Fewest feasible options first, then the biggest gangs: packs scarce types.
            sorted(range(len(window)), key=lambda k: (int(n_options[k]), -int(batch.n_gpus[k]), k)),
        )
        best_score = _placed(a[: len(window)], first)
        best: tuple[dict[str, Decision], PoolState] = ({d.job_id: d for d in a}, first)
        repacked = False
        for order in orders:
            trial = state.copy()
            b = self._greedy(tick, [pending[window[k]] for k in order], trial, backfill=False)
            by_id = {d.job_id: d for d in b}
            if not all(by_id[pending[k].job_id].state == "placed" for k in range(n_prefix)):
                continue
            count, cost = _placed(b, trial)
            if count > best_score[0] or (count == best_score[0] and cost < best_score[1] - 1e-9):
                best_score, best, repacked = (count, cost), (by_id, trial), True
        chosen, trial = best
        win_ids = [pending[k].job_id for k in window]
        placed = {j for j in win_ids if chosen[j].state == "placed"}
        if len(window) <= self.improve_max_jobs:
            search = LocalSearch({r.job_id: r for r in pending}, chosen, placed, trial)
            moved = search.run(self.name.value, now_s)
            repacked = repacked or moved
        if not repacked:
            # Nothing beat queue order: plain greedy with backfill, as without lookahead.
            given = self.given_rows(tick, 0, len(pending))
            return self._greedy(tick, pending, state, backfill=self.backfill, batch=given)
        # C: the window's placements stand; the rest of the queue goes on from there.
        rest = [r for r in pending if r.job_id not in placed]
        c_by_id = {d.job_id: d for d in self._greedy(tick, rest, trial, backfill=self.backfill)}
        out = [chosen[r.job_id] if r.job_id in placed else c_by_id[r.job_id] for r in pending]
        return self._commit(out, trial, state)

    def _continue(
        self, tick: Tick, head: list[Decision], first: PoolState, state: PoolState
    ) -> list[Decision]:
        """Plain greedy with backfill over the whole queue, given that its head (``head``,
        walked on ``first``) all started: that walk decides the head exactly so (no job
        waits, so nothing is reserved or fenced), so only the rest is walked, on ``first``,
        with the head's jobs running as backfill's walk would have added them."""
        now_s = tick.now_s
        live = list(tick.running)
        for d in head:
            opt = first.option_of(d.job_id)
            end = now_s + (opt.runtime_s if opt.runtime_s is not None else math.inf)
            live.append(RunningJob(d.job_id, opt, now_s, end))
        rest_tick = Tick(tick.pending, first, now_s, live)
        batch = self.given_rows(tick, len(head), len(tick.pending))
        rest = self._greedy(
            rest_tick, tick.pending[len(head) :], first, backfill=self.backfill, batch=batch
        )
        state.adopt(first)
        return [*head, *rest]

    @staticmethod
    def _uncontended(batch: OptionBatch, decisions: Sequence[Decision], state: PoolState) -> bool:
        """Whether every decision placed its job at the cost of the job's cheapest option
        that fits ``state`` (the state before any of them). Jobs that may be multi-node gangs
        are left to the full search (their fit is planned, not a supply comparison)."""
        if batch._gang_rows:
            return False
        if any(d.state != "placed" or d.chosen is None for d in decisions):
            return False
        chosen = np.array([d.chosen for d in decisions], np.int64)
        now = state.summary()
        rows = np.arange(len(decisions))
        if batch._exact_any or now.any_tight:
            # Some classes need the per-node host check: each job's own table decides.
            got = [batch.row(i, now).cheapest() for i in rows.tolist()]
            if None in got:
                return False
            cheapest = batch.cost[rows, np.array(got, np.int64)]
        else:
            fits = batch.fits_empty[: len(rows)] & (now.class_supply >= batch.demand[: len(rows)])
            cheapest = np.where(fits, batch.cost[: len(rows)], np.inf).min(axis=1)
        return bool((batch.cost[rows, chosen] == cheapest).all())

    @staticmethod
    def _commit(decisions: list[Decision], trial: PoolState, state: PoolState) -> list[Decision]:
        """Apply a trial state's placements to the caller's state, in decision order."""
        for d in decisions:
            if d.state == "placed":
                state.allocate(trial.option_of(d.job_id), d.job_id)
        return decisions

    def wait_for(
        self, table: OptionTable, idx: int, tick: Tick
    ) -> tuple[str, float, Option] | None:
        """With ``wait_for_cheaper``: wait for a cheaper option predicted to free up in time."""
        if not self.wait_for_cheaper:
            return None
        now_s = tick.now_s
        req = table.request
        now_cost = float(table.cost[idx])
        target = now_cost * (1.0 - self.min_saving)
        best = table.best(table.cost_keys(), table.fits_empty & (table.cost < target))
        if best is None:
            return None

        def cheaper(s: PoolState) -> tuple[OptionTable, int | None]:
            t = OptionTable(req, s)
            return t, t.best(t.cost_keys(), t.fits_now & (t.cost < target))

        found = earliest_fit(tick.state, tick.running, now_s, cheaper)
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


def _placed(decisions: Sequence[Decision], state: PoolState) -> tuple[int, float]:
    """Jobs placed and their total cost. The committed option is read from ``state``:
    ``d.chosen_option`` would build every (lazy) option of every decision."""
    count, cost = 0, 0.0
    for d in decisions:
        if d.state == "placed":
            count += 1
            o = state.option_of(d.job_id) if d.job_id in state else d.chosen_option
            cost += o.cost_usd if o is not None and o.cost_usd is not None else 0.0
    return count, cost


def _regret(cost: np.ndarray, ok: np.ndarray) -> list[float]:
    """Per job: second-cheapest distinct option cost minus the cheapest (inf: only one)."""
    c = np.where(ok, cost, np.inf)
    best = c.min(axis=1, initial=np.inf)
    dearer = np.where(c > best[:, None] * (1 + 1e-9) + 1e-12, c, np.inf)
    second = dearer.min(axis=1, initial=np.inf)
    with np.errstate(invalid="ignore"):
        r = np.where(np.isfinite(best), second - best, -np.inf)
    return [float(x) for x in r]
