"""The shared tick loop (SchedulerCore) and the clocks it runs on."""

from __future__ import annotations

import pytest

from scheduler.core.clock import VirtualClock
from scheduler.core.decision import Decision
from scheduler.core.loop import SchedulerCore
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.table import OptionTable
from scheduler.exceptions import PlacementError, SchedulerError
from scheduler.policies.base import Policy, Tick
from scheduler.policies.registry import PolicyName, get_policy
from tests.placement import flat_request

POOL = {
    "nodes": [
        {"name": "a40", "gpu": "A100-40GB", "count": 2},
        {"name": "h100", "gpu": "H100-80GB", "count": 2},
    ]
}


def _req(job_id: str, upper: float, n: int = 1, t: float = 0.0, prio: int = 0) -> PlacementRequest:
    return flat_request(job_id, upper, n, runtime=100.0, submit_time_s=t, priority=prio)


class _Lazy(Policy):
    """Places the first job's cheapest option without committing it; leaves the rest pending."""

    name = PolicyName.RIGHTSIZE

    def decide(self, tick: Tick) -> list[Decision]:
        state, now_s = tick.state, tick.now_s
        out = []
        for k, r in enumerate(tick.pending):
            table = OptionTable(r, state)
            c = table.cheapest()
            if k == 0 and c is not None:
                opt = table.option(c, table.bind(c, state))
                out.append(Decision(r.job_id, "lazy", "placed", [opt], 0, "first", None, now_s))
            else:
                out.append(Decision(r.job_id, "lazy", "pending", [], None, "later", None, now_s))
        return out


def test_submit_tick_finish_cycle() -> None:
    clock = VirtualClock()
    core = SchedulerCore(Pool.from_dict(POOL).state(), get_policy("rightsize"), clock)
    for k in range(5):
        core.submit(_req(f"j{k}", 30.0, t=float(k)))
    ds = core.tick()
    assert sum(d.state == "placed" for d in ds) == 4
    assert [r.job_id for r in core.pending] == ["j4"]
    assert set(core.running) == {"j0", "j1", "j2", "j3"}
    run = core.running["j0"]
    assert run.start_s == 0.0 and run.predicted_end_s == pytest.approx(run.option.runtime_s)
    clock.advance_to(100.0)
    core.finish("j0")
    ds = core.tick()
    assert [(d.job_id, d.state) for d in ds] == [("j4", "placed")]
    assert core.running["j4"].start_s == 100.0
    core.state.assert_consistent()
    assert core.counters.placed == 5 and core.counters.finished == 1
    with pytest.raises(PlacementError, match="not running"):
        core.finish("j0")


def test_queue_order_is_priority_then_submit_time() -> None:
    core = SchedulerCore(Pool.from_dict(POOL).state(), get_policy("rightsize"), VirtualClock())
    core.submit(_req("late-low", 1.0, t=5.0))
    core.submit(_req("early-low", 1.0, t=1.0))
    core.submit(_req("late-high", 1.0, t=9.0, prio=5))
    assert [r.job_id for r in core.pending] == ["late-high", "early-low", "late-low"]
    with pytest.raises(SchedulerError, match="already queued"):
        core.submit(_req("early-low", 1.0))


def test_core_rejects_what_fits_nowhere_whatever_the_policy() -> None:
    core = SchedulerCore(Pool.from_dict(POOL).state(), _Lazy(), VirtualClock())
    core.submit(_req("huge", 500.0))
    core.submit(_req("gang", 10.0, n=4))  # one 2-GPU node of each type: no 2-node gang
    core.submit(_req("ok", 10.0))
    ds = core.tick(0.0)
    states = {d.job_id: d.state for d in ds}
    assert states == {"huge": "rejected", "gang": "rejected", "ok": "placed"}
    gang = next(d for d in ds if d.job_id == "gang")
    assert "needs 4 GPUs of H100-80GB across 2 nodes of 2 GPUs" in gang.reason
    assert core.pending == []
    # The lazy policy did not commit; the core did.
    assert "ok" in core.state
    core.state.assert_consistent()


def test_oom_requeues_with_a_larger_reservation_in_place() -> None:
    clock = VirtualClock()
    core = SchedulerCore(Pool.from_dict(POOL).state(), get_policy("rightsize"), clock)
    core.submit(_req("a", 30.0, t=0.0))
    core.submit(_req("b", 30.0, t=1.0))
    core.tick()
    old = core.running["a"].option
    assert old.gpu_type == "A100-40GB"
    with pytest.raises(PlacementError, match="must exceed"):
        core.oom("a", 10.0)
    req = core.oom("a", 45.0)
    assert req.reserved_gib == 45.0
    assert "a" not in core.state and core.counters.oom_kills == 1
    core.submit(_req("c", 1.0, t=2.0))
    assert core.pending[0].job_id == "a"  # keeps its turn
    clock.advance_to(5.0)
    ds = {d.job_id: d for d in core.tick()}
    new = ds["a"].chosen_option
    assert new is not None and new.reserved_gib >= 45.0
    assert new.gpu_type == "H100-80GB"  # no longer fits an A100-40GB
    core.state.assert_consistent()


def test_cancel_queued_and_running() -> None:
    core = SchedulerCore(Pool.from_dict(POOL).state(), get_policy("rightsize"), VirtualClock())
    core.submit(_req("a", 1.0))
    core.tick(0.0)
    core.submit(_req("b", 1.0))
    assert core.cancel("a") and core.cancel("b")
    assert not core.cancel("nope")
    assert len(core.state) == 0 and core.pending == []


def test_same_inputs_same_decisions() -> None:
    def run() -> list[dict[str, object]]:
        clock = VirtualClock()
        core = SchedulerCore(Pool.from_dict(POOL).state(), get_policy("rightsize"), clock)
        out = []
        for k in range(8):
            core.submit(_req(f"j{k}", 5.0 + 9 * k, n=1 + k % 2, t=float(k)))
        for t in (0.0, 50.0, 150.0):
            clock.advance_to(t)
            for jid, job in list(core.running.items()):
                if job.predicted_end_s <= t:
                    core.finish(jid)
            out += [d.to_dict() for d in core.tick()]
        return out

    assert run() == run()


class _Seen(Policy):
    """Records the batch each tick hands over; leaves every job pending."""

    name = PolicyName.RIGHTSIZE

    def __init__(self) -> None:
        self.batches: list[object] = []

    def decide(self, tick: Tick) -> list[Decision]:
        self.batches.append(tick.batch)
        if tick.batch is not None:
            assert list(tick.batch.requests) == list(tick.pending)
        return [
            Decision(r.job_id, "seen", "pending", [], None, "later", None, tick.now_s)
            for r in tick.pending
        ]


def test_core_hands_its_batch_to_the_policy_only_when_the_queue_is_the_new_jobs() -> None:
    seen = _Seen()
    core = SchedulerCore(Pool.from_dict(POOL).state(), seen, VirtualClock())
    core.submit(_req("a", 10.0))
    core.tick()  # the queue is the one new job: its batch goes along
    core.tick()  # nothing new: the policy builds its own
    core.submit(_req("b", 10.0))
    core.tick()  # an older job waits too: the new jobs' batch does not cover the queue
    assert seen.batches[0] is not None and seen.batches[1:] == [None, None]
