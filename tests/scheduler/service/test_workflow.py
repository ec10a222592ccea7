"""Arrays, dependencies (afterok), hold / release / requeue, the queue and accounting, on a real
Redis with the leader and simulated workers of the demo pool."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from predictor.gpus import get_gpu
from scheduler.core.pool import Pool, load_pool
from scheduler.exceptions import ServiceError, UnknownDependencyError
from scheduler.service.client import Client, JobHandle
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.scheduler.service._simpool import DEMO_POOL, SimPool

SMALL = Path(__file__).resolve().parents[3] / "datasets/pools/small.toml"


@pytest.fixture
def client(store: RedisStore) -> Client:
    return Client(store=store)


@pytest.fixture
def small() -> Pool:
    return load_pool(SMALL)


def _lease() -> int:
    return int(time.time() * 1000) + 60_000


def _run_attempt(store: RedisStore, job_id: str, state: str = "succeeded") -> None:
    """What a worker does with a placed attempt: start it, then end it in ``state``."""
    attempt = int(store.get_fields([job_id], ["attempt"])[0][0] or 0)
    assert store.start(job_id, attempt, "w1", _lease()) == "ok"
    outcome = json.dumps({"attempt": attempt, "state": state, "runtime_s": 1.0})
    reason = "" if state == "succeeded" else "exit code 1"
    assert store.finish(job_id, attempt, state, outcome, reason) == "ok"


def _started(
    store: RedisStore, client: Client, pool: Pool, lease_ms: int
) -> tuple[JobHandle, SchedulerService]:
    """Job ``a`` placed by a new leader and started by worker ``w1`` with this lease."""
    h = client.submit(spec("a"))
    svc = SchedulerService(store, pool)
    svc.step()
    assert store.start(h.id, 1, "w1", lease_ms) == "ok"
    return h, svc


def _share(p: dict[str, Any]) -> float:
    """GPUs a placement holds, a MIG slice or MPS share as its fraction (accounting's rule)."""
    if p["kind"] == "mig":
        return float(p["capacity_gib"]) / get_gpu(p["gpu_type"]).memory_gib
    if p["kind"] == "shared":
        return float(p["reserved_gib"]) / float(p["capacity_gib"])
    return float(p["n_gpus"])


# -- the 100-element array with a dependency chain -----------------------------------------------


def test_hundred_element_chain_and_fan_in_run_to_the_end_and_acct_sums_them(
    store: RedisStore, client: Client, tmp_path: Path
) -> None:
    base = spec("x", command=["python", "shard.py", "{index}"], id="sweep-{index}", team="nlp")
    arr = client.submit_array(base, "0-99", chain=True)
    ids = [h.id for h in arr]
    assert ids == [f"sweep-{i}" for i in range(100)]
    assert arr[7].spec.command == ["python", "shard.py", "7"]
    assert arr[7].spec.depends_on == ("sweep-6",)
    fan_in = client.submit(spec("report", depends_on=ids, team="nlp", user="carol"))
    # Only the head of the chain is placeable; every other element waits and says on whom.
    assert client.store.pending_window(200) == ["sweep-0"]
    rows = {r.id: r for r in client.queue()}
    assert rows["sweep-5"].reason == "Dependency: waiting on job sweep-4 (pending) to succeed"
    assert rows["job-report"].reason.startswith("Dependency: waiting on job sweep-0")

    sim = SimPool(store, tmp_path)
    counts = sim.run_until_idle(client)
    assert counts["succeeded"] == 101, counts
    assert counts["pending"] == counts["failed"] == 0
    # afterok held: each element started only after the one before it had finished.
    recs = {j: store.get_job(j) for j in [*ids, fan_in.id]}
    for prev, cur in itertools.pairwise(ids):
        assert float(recs[cur]["started_at"]) >= float(recs[prev]["finished_at"])
    last_end = max(float(recs[j]["finished_at"]) for j in ids)
    assert float(recs[fan_in.id]["started_at"]) >= last_end
    kinds = [e["event"] for _, e in store.events(count=100_000)]
    assert kinds.count("released") == 100  # 99 chain links + the fan-in

    # acct against the placement log, recomputed here attempt by attempt (a simulated OOM
    # retries a job: every attempt is charged), and against each job record's last attempt.
    got = client.acct()
    total = got["total"]
    events = [e for _, e in store.events(count=100_000)]
    placed = {(e["job_id"], e["attempt"]): e["option"] for e in events if e["event"] == "placed"}
    ended = {
        (e["job_id"], e["outcome"]["attempt"]): e["outcome"]
        for e in events
        if e.get("outcome") and e["job_id"] in recs
    }
    assert set(ended) == {k for k in placed if k[0] in recs}
    exp_cost = exp_hours = 0.0
    for (j, _), o in ended.items():
        p = placed[(j, o["attempt"])]
        exp_cost += p["cost_usd"] * o["runtime_s"] / p["runtime_s"]
        exp_hours += _share(p) * o["runtime_s"] / 3600
    for j, rec in recs.items():
        p, o = json.loads(rec["placement"]), json.loads(rec["outcome"])
        row = next(r for r in got["jobs"] if r["id"] == j)
        assert row["attempts"] == sum(1 for k in placed if k[0] == j) >= 1
        assert row["state"] == "succeeded" and row["simulated"]
        assert row["runtime_s"] == pytest.approx(o["runtime_s"])
        assert row["peak_vram_gib"] == pytest.approx(o["peak_vram_gib"])
        assert row["reserved_gib"] == pytest.approx(p["reserved_gib"])
        assert row["predicted_vram_gib"] == pytest.approx(p["vram_gib"])
    n_attempts = len(ended)
    assert total["jobs"] == 101 and total["attempts"] == n_attempts
    assert total["cost_usd"] == pytest.approx(exp_cost, rel=1e-9)
    assert total["gpu_hours"] == pytest.approx(exp_hours, rel=1e-9)
    assert exp_cost > 0 and exp_hours > 0
    # Grouped sums add up to the total; the fan-in is carol's, the array the submitter's.
    by_user = {g["key"]: g for g in client.acct(by="user")["groups"]}
    assert by_user["carol"]["jobs"] == 1
    assert sum(g["cost_usd"] for g in by_user.values()) == pytest.approx(exp_cost, rel=1e-9)
    by_team = client.acct(by="team")["groups"]
    assert [g["key"] for g in by_team] == ["nlp"] and by_team[0]["jobs"] == 101
    # A window that ends before the first attempt charges nothing.
    first = min(float(r["started_at"]) for r in recs.values())
    assert client.acct(until=first - 1)["total"]["attempts"] == 0
    assert client.acct(since=first - 1)["total"]["attempts"] == n_attempts


# -- dependencies ----------------------------------------------------------------------------------


def test_parent_failure_fails_children_and_grandchildren_naming_the_parent(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many(
        [spec("a"), spec("b", depends_on=["job-a"]), spec("c", depends_on=["job-b"])]
    )
    SchedulerService(store, small).step()
    _run_attempt(store, "job-a", "failed")
    b, c = client.get("job-b"), client.get("job-c")
    assert b.status() == "failed"
    assert b.reason == "DependencyNeverSatisfied: parent job job-a failed"
    assert c.status() == "failed"
    assert c.reason == "DependencyNeverSatisfied: parent job job-b failed"
    assert store.pending_window(10) == []
    failed = [e for _, e in store.events() if e["event"] == "dependency_failed"]
    assert [e["job_id"] for e in failed] == ["job-b", "job-c"]
    # A job submitted after its parent failed fails at once, with the same reason.
    late = client.submit(spec("d", depends_on=["job-a"]))
    assert late.status() == "failed" and "parent job job-a failed" in late.reason


def test_cancelled_or_rejected_parent_fails_the_child(
    store: RedisStore, client: Client, small: Pool
) -> None:
    huge = spec("huge", model="llama-2-70b", gpu="A100-40GB")  # fits nowhere: rejected
    client.submit_many(
        [spec("p"), huge, spec("k1", depends_on=["job-p"]), spec("k2", depends_on=["job-huge"])]
    )
    client.cancel("job-p")
    SchedulerService(store, small).step()
    assert client.get("job-k1").reason == "DependencyNeverSatisfied: parent job job-p cancelled"
    assert client.get("job-k2").reason == "DependencyNeverSatisfied: parent job job-huge rejected"


def test_child_waits_for_every_parent_then_is_placed(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many([spec("a"), spec("b"), spec("c", depends_on=["job-a", "job-b"])])
    svc = SchedulerService(store, small)
    assert svc.step().placed == 2
    # The record says what held it at submit; the queue says what holds it now.
    assert "job-a (pending)" in client.get("job-c").reason
    assert client.queue(job_ids=["job-c"])[0].reason == (
        "Dependency: waiting on job job-a (placed) to succeed"
    )
    _run_attempt(store, "job-a")
    assert client.get("job-c").reason == "Dependency: waiting on job job-b (placed) to succeed"
    assert svc.step().placed == 0
    _run_attempt(store, "job-b")
    assert client.get("job-c").reason == ""
    assert svc.step().placed == 1
    assert client.get("job-c").status() == "placed"


def test_unknown_parent_cycle_and_self_dependency_are_refused_at_submit(client: Client) -> None:
    with pytest.raises(UnknownDependencyError, match="'nope', which does not exist"):
        client.submit_many([spec("a"), spec("b", depends_on=["nope"])])
    assert client.store.job_ids() == []  # nothing of the batch was written
    with pytest.raises(ServiceError, match="cycle: job-a -> job-b -> job-a"):
        client.submit_many([spec("a", depends_on=["job-b"]), spec("b", depends_on=["job-a"])])
    from predictor.exceptions import SpecError

    with pytest.raises(SpecError, match="own id 'job-a'"):
        client.submit(spec("a", depends_on=["job-a"]))


def test_children_before_parents_in_a_batch_are_written_parents_first(client: Client) -> None:
    hs = client.submit_many([spec("child", depends_on=["job-mid"]), spec("mid", depends_on=[
        "job-root"]), spec("root")])  # fmt: skip
    assert [h.id for h in hs] == ["job-child", "job-mid", "job-root"]  # handles in input order
    assert client.store.pending_window(10) == ["job-root"]


# -- hold / release ------------------------------------------------------------------------------


def test_hold_keeps_a_job_unplaced_until_release(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many([spec("a"), spec("b")])
    assert client.hold(["job-a", "job-x"]) == {"job-a": "held", "job-x": "missing"}
    assert client.hold("job-a") == {"job-a": "already held"}
    svc = SchedulerService(store, small)
    assert svc.step().placed == 1
    row = client.queue(job_ids=["job-a"])[0]
    assert row.state == "pending" and row.held
    assert row.reason.startswith("JobHeldUser: held by user")
    assert client.hold("job-b") == {"job-b": "placed"}  # only a pending job can be held
    assert client.release("job-a") == {"job-a": "released"}
    assert client.release("job-a") == {"job-a": "not held"}
    assert svc.step().placed == 1
    assert client.get("job-a").status() == "placed"
    kinds = [e["event"] for _, e in store.events()]
    assert kinds.count("held") == 1 and kinds.count("released") == 1


def test_hold_after_the_leader_read_the_job_refuses_its_commit(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit(spec("a"))
    svc = SchedulerService(store, small)
    svc._lead()
    svc._ingest(time.time())
    decisions = svc.core.tick(time.time())
    client.hold("job-a")
    placed, conflicts = svc._commit([d for d in decisions if d.state == "placed"], time.time())
    assert (placed, conflicts) == (0, 1)
    assert client.get("job-a").status() == "pending" and store.alloc_ids() == []
    svc.assert_consistent()


def test_held_child_stays_held_when_its_parent_succeeds(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many([spec("a"), spec("b", depends_on=["job-a"])], hold=False)
    client.hold("job-b")
    SchedulerService(store, small).step()
    _run_attempt(store, "job-a")
    assert store.pending_window(10) == []
    assert client.get("job-b").reason.startswith("JobHeldUser")
    client.release("job-b")
    assert store.pending_window(10) == ["job-b"]


def test_submit_held(client: Client, small: Pool) -> None:
    client.submit_many([spec("a")], hold=True)
    client.submit(spec("b"))
    assert client.store.pending_window(10) == ["job-b"]
    held, free = client.queue()
    assert held.held and held.reason.startswith("JobHeldUser")
    assert free.reason.startswith("NoScheduler: no `snugfit scheduler` holds the leader lease")
    SchedulerService(client.store, small, lease_ttl_s=30).step()
    client.hold("job-b")  # placed now: cannot be held
    assert client.queue(job_ids=["job-a"])[0].reason.startswith("JobHeldUser")


# -- requeue ---------------------------------------------------------------------------------------


def test_requeue_placed_and_finished_jobs_as_new_attempts(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many([spec("a"), spec("b")])
    svc = SchedulerService(store, small)
    svc.step()
    _run_attempt(store, "job-b", "failed")
    assert client.requeue(["job-a", "job-b"]) == {"job-a": "requeued", "job-b": "requeued"}
    assert store.alloc_ids() == []  # the placed job gave its capacity back at once
    for j in ("job-a", "job-b"):
        assert client.get(j).status() == "pending"
    rec = store.get_job("job-b")
    assert rec is not None and "outcome" not in rec and rec["lost"] == "0"
    assert svc.step().placed == 2
    assert [client.get(j).placement.attempt for j in ("job-a", "job-b")] == [2, 2]  # type: ignore[union-attr]
    # The stale worker of attempt 1 can neither start nor finish over attempt 2.
    assert store.start("job-a", 1, "w1", _lease()) == "stale attempt"
    assert client.requeue("job-zz") == {"job-zz": "missing"}
    svc.assert_consistent()


def test_requeue_a_running_job_stops_it_first_then_places_it_again(
    store: RedisStore, client: Client, small: Pool
) -> None:
    h, svc = _started(store, client, small, _lease())
    assert client.requeue(h.id) == {h.id: "requested"}
    assert h.status() == "running" and store.alloc_ids() == [h.id]  # held until it stops
    assert store.heartbeat(h.id, 1, _lease()) == "cancel"  # the worker is told to stop it
    outcome = json.dumps({"attempt": 1, "state": "cancelled", "runtime_s": 2.0})
    assert store.finish(h.id, 1, "cancelled", outcome, "stopped") == "requeued"
    assert h.status() == "pending" and store.alloc_ids() == []
    assert svc.step().placed == 1
    assert h.placement is not None and h.placement.attempt == 2


def test_requeue_of_a_running_job_whose_worker_dies_still_requeues(
    store: RedisStore, client: Client, small: Pool
) -> None:
    h, svc = _started(store, client, small, int(time.time() * 1000) - 1)  # lease expired
    client.requeue(h.id)
    svc.step()  # the lease reclaim meets the requeue request: pending, then placed again
    assert h.placement is not None and h.placement.attempt == 2
    assert (store.get_job(h.id) or {}).get("lost") in (None, "0")  # no retry used


def test_requeue_of_a_child_whose_parent_failed_is_refused(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many([spec("a"), spec("b", depends_on=["job-a"])])
    SchedulerService(store, small).step()
    _run_attempt(store, "job-a", "failed")
    assert client.requeue("job-b") == {"job-b": "parent:job-a:failed"}
    # Requeue the parent, then the child: it waits on the parent again.
    assert client.requeue(["job-a", "job-b"]) == {"job-a": "requeued", "job-b": "requeued"}
    assert client.get("job-b").reason == "Dependency: waiting on job job-a (pending) to succeed"
    assert store.pending_window(10) == ["job-a"]


# -- queue and acct --------------------------------------------------------------------------------


def test_queue_filters_by_user_team_state_node_and_id(
    store: RedisStore, client: Client, small: Pool
) -> None:
    client.submit_many(
        [
            spec("a", user="alice", team="vision"),
            spec("b", user="bob", team="nlp", gpu="B200-180GB"),
            spec("c", user="bob"),
        ]
    )
    client.hold("job-c")
    SchedulerService(store, small).step()
    assert store.start("job-a", 1, "w1", _lease()) == "ok"
    rows = client.queue()
    assert [r.id for r in rows] == ["job-a", "job-b", "job-c"]
    a = rows[0]
    assert a.state == "running" and a.option and a.node and a.elapsed_s is not None
    assert a.remaining_s is not None and a.remaining_s >= 0
    assert a.user == "alice" and a.team == "vision"
    assert [r.id for r in client.queue(users=["bob"])] == ["job-b", "job-c"]
    assert [r.id for r in client.queue(teams=["nlp"])] == ["job-b"]
    assert [r.id for r in client.queue(states=["pending"])] == ["job-c"]
    assert rows[1].node != a.node, (a, rows[1])
    assert [r.id for r in client.queue(nodes=[a.node])] == ["job-a"]
    assert [r.id for r in client.queue(job_ids=["job-b", "nope"])] == ["job-b"]
    with pytest.raises(ServiceError, match="unknown job state 'queued'"):
        client.queue(states=["queued"])
    _run_attempt(store, "job-a")
    assert "job-a" not in [r.id for r in client.queue()]  # squeue lists active jobs
    done = client.queue(states=["succeeded"])
    assert [r.id for r in done] == ["job-a"] and done[0].elapsed_s == 1.0


def test_user_defaults_to_the_submitting_os_user(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGNAME", "dora")
    h = client.submit(spec("a"))
    assert h.spec.user == "dora" and h.spec.team is None
    assert client.queue()[0].user == "dora"


def test_acct_charges_every_attempt_and_windows_by_end_time(
    store: RedisStore, client: Client, tmp_path: Path
) -> None:
    pool = load_pool(DEMO_POOL)
    client.submit_many([spec(i, user="u1" if i % 2 else "u2", team="t") for i in range(6)])
    sim = SimPool(store, tmp_path, pool)
    sim.run_until_idle(client)
    mid = time.time()
    client.requeue("job-0")  # a second attempt of job-0
    sim.run_until_idle(client)
    got = client.acct()
    j0 = next(j for j in got["jobs"] if j["id"] == "job-0")
    assert j0["attempts"] == 2
    # Predicted vs actual is the last attempt's; cost and GPU-hours bill both.
    assert j0["runtime_total_s"] > j0["runtime_s"] > 0
    assert j0["runtime_ratio"] == pytest.approx(j0["runtime_s"] / j0["predicted_runtime_s"])
    assert got["total"]["attempts"] == 7 and got["total"]["jobs"] == 6
    later = client.acct(since=mid)
    assert later["total"]["attempts"] == 1 and [j["id"] for j in later["jobs"]] == ["job-0"]
    groups = {g["key"]: g for g in client.acct(by="user")["groups"]}
    assert groups["u1"]["jobs"] == 3 and groups["u2"]["attempts"] == 4
    assert math.isclose(
        groups["u1"]["cost_usd"] + groups["u2"]["cost_usd"], got["total"]["cost_usd"]
    )
    assert client.acct(users=["u1"])["total"]["jobs"] == 3


def test_parse_when_accepts_iso_relative_and_now() -> None:
    from scheduler.service.accounting import parse_when

    now = 1_800_000_000.0
    assert parse_when("2h", now) == now - 7200
    assert parse_when("1d", now) == now - 86400
    assert parse_when("30m", now) == now - 1800
    assert parse_when("now", now) == now
    from datetime import UTC, datetime

    iso = datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    assert parse_when("2027-01-15T08:00:00Z", now) == iso
    assert parse_when("2027-01-15T08:00", now) == parse_when("2027-01-15T08:00:00Z", now)
    with pytest.raises(ServiceError, match="not understood"):
        parse_when("yesterday", now)


def test_requeue_of_a_job_a_real_worker_runs_stops_it_and_runs_it_again(
    store: RedisStore, client: Client, tmp_path: Path
) -> None:
    import threading

    from workers.worker import NodeWorker

    pool = Pool.from_dict(
        {"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1}]}
    )
    h = client.submit(spec("a"))
    svc = SchedulerService(store, pool, simulated=True)
    assert svc.step().placed == 1

    def worker(scale: float) -> NodeWorker:
        return NodeWorker(store, "n1", pool=pool, simulate=True, time_scale=scale,
                          heartbeat_s=0.05, history_path=tmp_path / "h.jsonl")  # fmt: skip

    answers: list[dict[str, str]] = []

    def requeue_once_running() -> None:
        deadline = time.monotonic() + 30
        while h.status() != "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        answers.append(client.requeue(h.id))

    # RQ's worker needs the main thread (signal handlers): the user requeues from another.
    user = threading.Thread(target=requeue_once_running)
    user.start()
    worker(0.5).work(burst=True)  # returns once the job it started has ended
    user.join(timeout=30)
    assert answers == [{h.id: "requested"}]
    assert h.status() == "pending" and store.alloc_ids() == []
    events = [e for _, e in store.events()]
    stopped = [e for e in events if e["event"] == "requeued" and e.get("outcome")]
    assert len(stopped) == 1 and stopped[0]["attempt"] == 1
    assert stopped[0]["reason"] == "requeued by user (process stopped)"
    assert svc.step().placed == 1
    worker(1e-6).work(burst=True)
    assert h.wait(timeout=30) == "succeeded"
    assert h.placement is not None and h.placement.attempt == 2
    # Both attempts are charged: the stopped one for as long as it ran.
    job = client.acct()["jobs"][0]
    assert job["attempts"] == 2 and job["runtime_total_s"] > job["runtime_s"]
