"""The base of every greedy policy: decide each job in queue order, commit as you go.

A greedy policy is a handful of knobs (class attributes) and hooks (methods), not a bundle of
keyword arguments: what the queue may use (:meth:`GreedyPolicy.batch`), how options rank
(:meth:`GreedyPolicy.keys`), what the placement log says about the winner and the losers,
and whether the queue is FIFO or backfilled. The loop itself lives in :class:`_QueueWalk`,
one object per call, so its state (the reserved head job, the fenced state, who blocks the
queue) is named instead of threaded through one long function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.core.backfill import Probe, earliest_fit
from scheduler.core.binding import Binding, Select
from scheduler.core.decide import pending_decision, pending_from_batch, place, rejected_decision
from scheduler.core.decision import Decision, Option
from scheduler.core.options import OptionBatch
from scheduler.core.pool import MIB_PER_GIB, MILLI_PER_CPU, Pool
from scheduler.core.requests import PlacementRequest, RunningJob
from scheduler.core.state import PoolState
from scheduler.core.table import OptionTable
from scheduler.policies.base import Policy, Tick

__all__ = ["GreedyPolicy"]


class GreedyPolicy(Policy):
    """Each job takes the option minimising :meth:`keys` among those that fit now.

    ``backfill`` gives the first job that cannot start a reservation at the earliest time
    running jobs (and jobs placed earlier in this call) free enough capacity, per
    :meth:`running_end`; later jobs start only if they end before it (per :meth:`job_runtime`)
    or stay off its GPUs. ``strict_fifo`` without backfill makes every job behind a blocked
    head wait.
    """

    select: Select = "pack"
    loser_reason: str = "ranked lower by this policy"
    # Losers that fit say how much more they cost than the winner (else ``loser_reason``).
    by_cost: bool = True
    backfill: bool = False
    strict_fifo: bool = False

    def batch(self, pending: Sequence[PlacementRequest], pool: Pool) -> OptionBatch:
        """Sizes and prices the whole queue once; policies restrict types and kinds here."""
        return OptionBatch(pending, pool, select=self.select)

    def keys(self, table: OptionTable) -> Sequence[np.ndarray]:
        """Ranking keys, lexsort order (the last key is primary)."""
        return table.cost_keys()

    def chosen_reason(self, option: Option) -> str:
        return f"chosen by {self.name.value}: {option.label} on {option.node}"

    def job_runtime(self, request: PlacementRequest, option: Option) -> float:
        """How long a job would run on ``option``: whether it ends before a reservation."""
        return option.runtime_s if option.runtime_s is not None else math.inf

    def running_end(self, job: RunningJob) -> float:
        """When a running job frees its GPUs, as backfill's reservation arithmetic sees it."""
        return job.predicted_end_s

    def wait_for(
        self, table: OptionTable, idx: int, tick: Tick
    ) -> tuple[str, float, Option] | None:
        """(reason, start time, option) when the job should wait for a better option it can
        reserve instead of taking ``idx`` now; None to take it. ``tick.running`` includes the
        jobs placed earlier in this pass."""
        return None

    def decide(self, tick: Tick) -> list[Decision]:
        return self.walk(tick)

    def walk(
        self,
        tick: Tick,
        *,
        backfill: bool | None = None,
        strict_fifo: bool | None = None,
        batch: OptionBatch | None = None,
    ) -> list[Decision]:
        """The queue loop, with this policy's knobs unless ``backfill``/``strict_fifo`` say
        otherwise (a policy that tries several orders runs some without backfill). ``batch``:
        ``self.batch(tick.pending, pool)`` when the caller already built it."""
        knobs = {
            "backfill": self.backfill if backfill is None else backfill,
            "strict_fifo": self.strict_fifo if strict_fifo is None else strict_fifo,
        }
        if batch is None:
            batch = self.given_rows(tick, 0, len(tick.pending))
        return _QueueWalk(self, tick, batch=batch, **knobs).run()

    def given_rows(self, tick: Tick, lo: int, hi: int) -> OptionBatch | None:
        """Rows ``lo:hi`` of the batch the caller built for ``tick.pending`` (a fresh view,
        equal to :meth:`batch` of those jobs), where this policy's batch has the default
        knobs; None otherwise (the walk builds its own)."""
        if tick.batch is None or type(self).batch is not GreedyPolicy.batch:
            return None
        if self.select != "pack":  # OptionBatch's default: the caller's batch has it
            return None
        return tick.batch.rows(lo, hi)


class _QueueWalk:
    """One pass of a greedy policy over the queue."""

    def __init__(
        self,
        policy: GreedyPolicy,
        tick: Tick,
        *,
        backfill: bool,
        strict_fifo: bool,
        batch: OptionBatch | None = None,
    ) -> None:
        self.policy = policy
        self.name = policy.name.value
        self.pending = tick.pending
        self.state = state = tick.state
        self.now_s = tick.now_s
        self.backfill = backfill
        # FIFO without backfill: every job behind a blocked one waits.
        self.fifo = strict_fifo and not backfill
        self.batch = policy.batch(tick.pending, state.pool) if batch is None else batch
        # Running jobs plus those this pass places (with backfill); ``tick`` shows them to
        # the policy's hooks.
        self.live = list(tick.running)
        self.tick = Tick(tick.pending, state, tick.now_s, self.live)
        # The reserved head job (id, start time, GPUs) and the state with its GPUs fenced off.
        self.head: tuple[str, float, tuple[int, ...]] | None = None
        # What the reserved job needs of its node's CPUs and host memory beyond what the jobs
        # there that end before its start free: (node, millicores, MiB) per node it uses (a
        # multi-node gang uses several).
        self.head_hold: tuple[tuple[int, int, int], ...] = ()
        self.fenced: PoolState | None = None
        self.reserve_tried = False
        self.blocked_by: str | None = None
        # The state version the last job's "fits now" was answered at.
        self.seen_version: int | None = None
        # OptionBatch.fit_key of the jobs that did not fit: the walk's state only takes
        # allocations, so a later job with the same key does not fit either.
        self.no_fit: set[tuple[object, ...]] = set()

    def pick(self, table: OptionTable) -> int | None:
        return table.best_by(self.policy.keys)

    def probe_for(self, i: int) -> Probe:
        def f(s: PoolState) -> tuple[OptionTable, int | None]:
            t = self.batch.table(i, s)
            return t, self.pick(t)

        return f

    def run(self) -> list[Decision]:
        return [self.decide(i, req) for i, req in enumerate(self.pending)]

    def decide(self, i: int, req: PlacementRequest) -> Decision:
        batch, state, name, now_s = self.batch, self.state, self.name, self.now_s
        if not batch.fits_empty_any(i):
            return rejected_decision(batch.table(i, state), policy=name, now_s=now_s)
        if self.blocked_by is not None:
            why = f"waiting behind {self.blocked_by} (first in, first out)"
            return pending_from_batch(batch, i, state, policy=name, now_s=now_s, reason=why)
        # Only asked for once some key did not fit (the usual uncontended queue never asks).
        key = batch.fit_key(i) if self.no_fit else None
        if key in self.no_fit and (not self.backfill or self.reserve_tried):
            # What the check below would answer, without the check (see ``no_fit``).
            if self.fifo:
                self.blocked_by = req.job_id
            return pending_from_batch(batch, i, state, policy=name, now_s=now_s)
        table: OptionTable | None = None
        if state.version != self.seen_version:
            # The state moved since the last job asked (it placed): this job's table answers
            # "fits now"; fits_now_any answers runs of jobs while the state stays put.
            table = batch.table(i, state)
            fits = bool(np.count_nonzero(table.fits_now))
        else:
            fits = batch.fits_now_any(i, state)
        self.seen_version = state.version
        if not fits:
            self.no_fit.add(batch.fit_key(i) if key is None else key)
        if not fits and (not self.backfill or self.reserve_tried):
            if self.fifo:
                self.blocked_by = req.job_id
            return pending_from_batch(batch, i, state, policy=name, now_s=now_s)
        if table is None:
            table = batch.table(i, state)
        idx = self.pick(table)
        binding: Binding | None = None
        note = ""
        if idx is not None and self.head is not None and self.fenced is not None:
            fenced = self.fenced_pick(i, req, table, idx)
            if isinstance(fenced, Decision):
                return fenced
            table, idx, binding = fenced
            note = f" (backfilled ahead of {self.head[0]})"
        wait = None
        if idx is not None:
            wait = self.policy.wait_for(table, idx, self.tick)
            if wait is None:
                return self.commit(req, table, idx, binding, note)
        return self.hold(i, req, table, wait)

    def fenced_pick(
        self, i: int, req: PlacementRequest, table: OptionTable, idx: int
    ) -> Decision | tuple[OptionTable, int, Binding]:
        """Behind a reservation: the pick if it ends before the reserved start or stays off
        the reserved GPUs, else a pick on the fenced state, else a pending Decision."""
        assert self.head is not None and self.fenced is not None
        head_id, head_t, head_gpus = self.head
        binding = table.bind(idx, self.state)
        opt = table.option(idx, binding, reason="")
        est = self.policy.job_runtime(req, opt)
        clash = bool(set(binding.gpus) & set(head_gpus)) or self.host_clash(opt)
        if not (self.now_s + est > head_t and clash):
            return table, idx, binding
        ftable = self.batch.table(i, self.fenced)
        fidx = self.pick(ftable)
        if fidx is None:
            why = f"would delay {head_id}, which holds a reservation from t={head_t:.0f}s"
            return pending_decision(
                table, policy=self.name, now_s=self.now_s, reason=why, loser_reason=why
            )
        # The fenced table's arrays match the real state except on the fence, so its pick is
        # valid on the real state too; bind it there.
        return ftable, fidx, ftable.bind(fidx, self.fenced)

    def hold_for(self, head: Option, start_s: float) -> tuple[tuple[int, int, int], ...]:
        """(node, millicores, MiB) the reserved option needs at ``start_s`` on each of its
        nodes beyond what the jobs there that end by then free; none for an option without
        host figures."""
        pool = self.state.pool
        if not head.gpu_indices or head.cpus is None or head.host_memory_gib is None:
            return ()
        ending = [
            (r.option, {int(pool.gpu_node[g]) for g in r.option.gpu_indices})
            for r in self.live
            if self.policy.running_end(r) <= start_s
        ]
        out: list[tuple[int, int, int]] = []
        for k in dict.fromkeys(int(pool.gpu_node[g]) for g in head.gpu_indices):
            cpu, host = 0, 0
            for o, nodes in ending:
                if k in nodes:
                    cpu += round((o.cpus or 0.0) * MILLI_PER_CPU)
                    host += round((o.host_memory_gib or 0.0) * MIB_PER_GIB)
            need_cpu = round(head.cpus * MILLI_PER_CPU) - cpu
            need_host = round(head.host_memory_gib * MIB_PER_GIB) - host
            out.append((k, max(need_cpu, 0), max(need_host, 0)))
        return tuple(out)

    def host_clash(self, opt: Option) -> bool:
        """Whether ``opt`` lands on a node of the reserved job and takes CPUs or host memory
        the reservation holds there."""
        state = self.state
        if not self.head_hold or not opt.gpu_indices:
            return False
        pool = state.pool
        mine = {int(pool.gpu_node[g]) for g in opt.gpu_indices}
        cpu = round((opt.cpus or 0.0) * MILLI_PER_CPU)
        host = round((opt.host_memory_gib or 0.0) * MIB_PER_GIB)
        for k, hold_cpu, hold_host in self.head_hold:
            if k not in mine:
                continue
            free_cpu = int(pool.node_cpu_milli[k] - state.node_cpu_milli[k]) - hold_cpu
            free_host = int(pool.node_host_mib[k] - state.node_host_mib[k]) - hold_host
            if cpu > free_cpu or host > free_host:
                return True
        return False

    def commit(
        self,
        req: PlacementRequest,
        table: OptionTable,
        idx: int,
        binding: Binding | None,
        note: str,
    ) -> Decision:
        policy, state = self.policy, self.state
        d = place(
            table,
            idx,
            state,
            policy=self.name,
            now_s=self.now_s,
            reason="",
            keys=policy.keys,
            loser_reason=policy.loser_reason,
            by_cost=policy.by_cost,
            binding=binding,
        )
        opt = state.option_of(req.job_id)
        d.reason = policy.chosen_reason(opt) + note
        if self.backfill:
            end = self.now_s + (opt.runtime_s if opt.runtime_s is not None else math.inf)
            self.live.append(RunningJob(req.job_id, opt, self.now_s, end))
        if self.head is not None:
            self.fenced = state.fenced(self.head[2], self.head_hold)
        return d

    def hold(
        self,
        i: int,
        req: PlacementRequest,
        table: OptionTable,
        wait: tuple[str, float, Option] | None,
    ) -> Decision:
        """A job that does not start now; with backfill, the first one reserves its start."""
        reserve: tuple[float, Option] | None = None
        if wait is not None:
            d = pending_decision(table, policy=self.name, now_s=self.now_s, reason=wait[0])
            reserve = (wait[1], wait[2])
        else:
            d = pending_decision(table, policy=self.name, now_s=self.now_s)
            if self.backfill and not self.reserve_tried:
                self.reserve_tried = True
                reserve = earliest_fit(
                    self.state,
                    self.live,
                    self.now_s,
                    self.probe_for(i),
                    end_of=self.policy.running_end,
                )
        if self.backfill and self.head is None and reserve is not None:
            t, o = reserve
            self.head = (req.job_id, t, o.gpu_indices)
            self.head_hold = self.hold_for(o, t)
            self.fenced = self.state.fenced(o.gpu_indices, self.head_hold)
            d.reason += f"; reserved {o.label} on {o.node} from t={t:.0f}s"
        if self.fifo:
            self.blocked_by = req.job_id
        return d
