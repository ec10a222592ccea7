"""`snugfit log / explain / pool` against a real Redis, populated through the service's Store
exactly as the scheduler and workers write it (scheduler.service.store.keys layout)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from predictor.analytical import predict, predict_table
from predictor.spec import parse_spec
from scheduler.cli.ops import explain_command, log_command, parse_record, pool_command
from scheduler.core.decision import Decision
from scheduler.core.loop import SchedulerCore
from scheduler.core.pool import MIB_PER_GIB, Pool, load_pool
from scheduler.core.requests import PlacementRequest
from scheduler.policies.registry import get_policy
from scheduler.service._commit import capacity_rows
from scheduler.service.store.keys import queue_name, rq_job_id
from scheduler.service.store.protocol import Commit
from scheduler.service.store.records import dumps
from scheduler.service.store.redis_store import RedisStore, open_store

REPO = Path(__file__).resolve().parents[3]

_SPECS: list[dict[str, Any]] = [
    # Pinned 2-GPU jobs on a 2-GPU B200 node: the first runs, the others wait for it.
    {"id": "big-0", "model": "llama-3.1-70b", "task": "inference", "batch_size": 8,
     "input_len": 1024, "output_len": 256, "num_requests": 500, "n_gpus": 2,
     "tensor_parallel": 2, "gpu": "B200-180GB"},
    {"id": "big-1", "model": "llama-3.1-70b", "task": "inference", "batch_size": 8,
     "input_len": 1024, "output_len": 256, "num_requests": 500, "n_gpus": 2,
     "tensor_parallel": 2, "gpu": "B200-180GB"},
    {"id": "small-0", "model": "qwen2.5-7b", "task": "inference", "batch_size": 4,
     "input_len": 512, "output_len": 128, "num_requests": 200},
    {"id": "lora-0", "model": "llama-3.1-8b", "task": "lora", "batch_size": 4, "seq_len": 2048,
     "steps": 300, "lora_rank": 16},
]  # fmt: skip


@dataclass
class Scenario:
    url: str
    pool: Pool
    decisions: dict[str, Decision]
    finished: str
    running: str
    pending: str


def _write(redis_url: str) -> Scenario:
    pool = load_pool(REPO / "datasets/pools/small.toml")
    specs = [parse_spec(s) for s in _SPECS]
    table = predict_table(specs)
    preds = predict(specs)
    core = SchedulerCore(pool.state(), get_policy("rightsize"))
    for i, s in enumerate(specs):
        core.submit(PlacementRequest.from_table(s, table, i))
    decisions = {d.job_id: d for d in core.tick(1000.0)}
    store = RedisStore(__import__("redis").Redis.from_url(redis_url))
    config = pool.to_dict()
    gpus, nodes = capacity_rows(pool)
    store.init_pool(json.dumps(config, sort_keys=True), pool.name, gpus, nodes)
    now = time.time()
    records = []
    for k, s in enumerate(specs):
        assert s.id is not None
        by_gpu = {p.gpu: p.model_dump() for p in preds if p.id == s.id}
        records.append(
            {
                "id": s.id,
                "spec": dumps(s.to_dict()),
                "predictions": dumps(by_gpu),
                "method": "analytical",
                "submitted_at": repr(now + k * 0.001),
                "updated_at": repr(now),
                "attempt": "0",
                "max_retries": "2",
                "lost": "0",
                "ooms": "0",
                "max_oom_retries": "3",
            }
        )
    assert store.add_jobs(records) == [True] * len(records)
    placed = [d for d in decisions.values() if d.state == "placed"]
    pending = [d for d in decisions.values() if d.state == "pending"]
    assert len(placed) >= 2 and pending, [(d.job_id, d.state) for d in decisions.values()]
    events: list[dict[str, Any]] = []
    for d in placed:
        opt = d.chosen_option
        assert opt is not None
        state = pool.state()
        state.allocate(opt, d.job_id)
        alloc = state._allocs[d.job_id]
        node = opt.node or "?"
        placement = {
            "attempt": 1,
            "node": node,
            "queue": queue_name(node),
            "rq_job_id": rq_job_id(d.job_id, 1),
            "label": opt.label,
            "kind": opt.kind,
            "gpu_type": opt.gpu_type,
            "gpu_indices": list(opt.gpu_indices),
            "mig_profile": opt.mig_profile,
            "mig_start": opt.mig_start,
            "reserved_gib": opt.reserved_gib,
            "cost_usd": opt.cost_usd,
            "runtime_s": opt.runtime_s,
            "placed_at": now,
            "policy": d.policy,
            "simulated": True,
        }
        alloc_json = dumps(
            {
                "attempt": 1,
                "kind": alloc.kind,
                "gpus": list(alloc.gpus),
                "used_mib": alloc.used_mib,
                "reserved_mib": alloc.reserved_mib,
                "mig_mask": alloc.mig_mask,
                "option": opt.to_dict(),
            }
        )
        res = store.commit(
            [Commit(d.job_id, 0, alloc_json, dumps(placement), dumps(d.to_dict()))],
            token="",
            fenced=False,
        )
        assert res[0].startswith("ok"), res
        runner = d.options[d.runner_up].to_dict() if d.runner_up is not None else None
        events.append(
            {"ts": now, "event": "placed", "job_id": d.job_id, "attempt": 1, "node": node,
             "option": opt.to_dict(), "cost_usd": opt.cost_usd, "runner_up": runner,
             "reason": d.reason, "policy": d.policy, "outcome": None, "simulated": True}
        )  # fmt: skip
        assert store.start(d.job_id, 1, f"w-{node}", int(now * 1000) + 60_000) == "ok"
    for d in pending:
        store.set_fields(d.job_id, {"decision": dumps(d.to_dict()), "reason": d.reason})
    # Finish a job that is not on the B200s, so big-0 keeps both B200s busy.
    done = next(d for d in placed if d.job_id != "big-0")
    opt = done.chosen_option
    assert opt is not None and opt.vram_gib is not None and opt.runtime_s is not None
    outcome = {
        "attempt": 1,
        "state": "succeeded",
        "exit_code": 0,
        "peak_vram_gib": opt.vram_gib * 0.93,
        "runtime_s": opt.runtime_s * 1.1,
        "oom": False,
        "simulated": True,
        "reason": "",
        "worker": "w",
        "node": opt.node,
    }
    assert store.finish(done.job_id, 1, "succeeded", dumps(outcome), "") == "ok"
    events.append(
        {"ts": now + 1, "event": "finished", "job_id": done.job_id, "attempt": 1,
         "node": opt.node, "option": opt.to_dict(), "cost_usd": opt.cost_usd, "runner_up": None,
         "reason": "exit 0", "policy": "rightsize", "outcome": outcome, "simulated": True}
    )  # fmt: skip
    store.emit(events)
    store.register_node("b200-0", {"worker": "w", "heartbeat_at": repr(time.time())})
    store.close()
    pend = next(d for d in pending if d.job_id == "big-1")
    return Scenario(redis_url, pool, decisions, done.job_id, "big-0", pend.job_id)


@pytest.fixture
def scenario(redis_url: str) -> Scenario:
    return _write(redis_url)


def _run(cmd: Any, args: list[str], url: str) -> str:
    result = CliRunner().invoke(cmd, [*args, "--url", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_log_prints_one_readable_line_per_event(scenario: Scenario) -> None:
    out = _run(log_command, [], scenario.url)
    lines = out.strip().splitlines()
    n_placed = sum(d.state == "placed" for d in scenario.decisions.values())
    assert len(lines) == n_placed + 1
    assert sum(" placed " in ln for ln in lines) == n_placed
    finished = [ln for ln in lines if " finished " in ln]
    assert len(finished) == 1 and scenario.finished in finished[0]
    assert "peak" in finished[0] and "exit 0" in finished[0]


def test_log_json_filters_by_job(scenario: Scenario) -> None:
    out = _run(log_command, ["--json", "--job", scenario.finished], scenario.url)
    events = [json.loads(ln) for ln in out.strip().splitlines()]
    assert [e["event"] for e in events] == ["placed", "finished"]
    assert all(e["job_id"] == scenario.finished for e in events)
    assert events[0]["option"]["gpu_type"] in {"A100-40GB", "A100-80GB", "H100-80GB",
                                               "H200-141GB", "B200-180GB"}  # fmt: skip


def test_log_last_n_keeps_only_the_tail(scenario: Scenario) -> None:
    out = _run(log_command, ["--json", "-n", "1"], scenario.url)
    events = [json.loads(ln) for ln in out.strip().splitlines()]
    assert [e["event"] for e in events] == ["finished"]


def test_log_last_zero_prints_nothing_and_last_n_applies_to_one_job(scenario: Scenario) -> None:
    assert _run(log_command, ["-n", "0"], scenario.url).strip() == ""
    out = _run(log_command, ["--json", "--job", scenario.finished, "-n", "1"], scenario.url)
    assert [json.loads(ln)["event"] for ln in out.strip().splitlines()] == ["finished"]


def test_log_prints_in_time_order_and_help_has_no_placeholder(scenario: Scenario) -> None:
    store = open_store(scenario.url)
    try:
        store.emit([{"ts": 1.0, "event": "invalid", "job_id": None, "reason": "early"}])
    finally:
        store.close()
    out = _run(log_command, ["--json"], scenario.url)
    ts = [json.loads(ln)["ts"] for ln in out.strip().splitlines()]
    assert ts == sorted(ts) and ts[0] == 1.0
    help_text = CliRunner().invoke(log_command, ["--help"]).output
    assert "P:events" not in help_text and "<prefix>:events" in help_text


def test_log_follow_sees_new_events(scenario: Scenario) -> None:
    import threading

    import redis

    def later() -> None:
        time.sleep(0.3)
        s = RedisStore(redis.Redis.from_url(scenario.url))
        s.emit([{"ts": time.time(), "event": "requeued", "job_id": "late", "reason": "OOM"}])
        s.close()

    t = threading.Thread(target=later)
    t.start()
    out = _run(log_command, ["-f", "--json", "--idle-exit", "1.5"], scenario.url)
    t.join()
    events = [json.loads(ln) for ln in out.strip().splitlines()]
    assert events[-1]["job_id"] == "late" and events[-1]["event"] == "requeued"


def test_explain_finished_job_shows_table_breakdown_and_actuals(scenario: Scenario) -> None:
    out = _run(explain_command, [scenario.finished, "--width", "200"], scenario.url)
    assert "CHOSEN" in out and "✔" in out
    for comp in ("weights", "kv_cache", "overhead"):
        assert comp in out
    assert "predicted vs actual (simulated run)" in out
    assert "0.93x" in out  # measured peak / predicted
    d = scenario.decisions[scenario.finished]
    assert len(d.options) > 1
    assert "state=succeeded" in out


def test_explain_pending_job_says_why_in_slurm_style(scenario: Scenario) -> None:
    out = _run(explain_command, [scenario.pending, "--width", "200"], scenario.url)
    assert "Reason=Resources" in out
    assert "insufficient free B200-180GB: 2 more needed" in out
    assert "CHOSEN" not in out


def test_explain_json_and_unknown_job(scenario: Scenario) -> None:
    out = _run(explain_command, [scenario.running, "--json"], scenario.url)
    rec = json.loads(out)
    assert rec["state"] == "running" and rec["placement"]["attempt"] == 1
    result = CliRunner().invoke(explain_command, ["nope", "--url", scenario.url])
    assert result.exit_code != 0 and "no job with id 'nope'" in result.output


def test_pool_shows_who_runs_where_and_free_capacity(scenario: Scenario) -> None:
    out = _run(pool_command, ["--width", "220"], scenario.url)
    assert scenario.running in out
    assert scenario.finished not in out  # released when it finished
    assert "free capacity by type" in out
    for node in scenario.pool.nodes:
        assert node.name in out
    assert "●" in out  # b200-0 registered a fresh heartbeat


def test_pool_json_matches_allocations(scenario: Scenario) -> None:
    data = json.loads(_run(pool_command, ["--json"], scenario.url))
    assert scenario.running in data["allocations"]
    assert scenario.finished not in data["allocations"]
    b200 = data["free_by_type"]["B200-180GB"]
    assert b200["gpus"] == 2 and b200["idle_gpus"] == 0
    cap = scenario.pool.capacity_mib
    total = sum(int(c) for c, t in zip(cap, scenario.pool.gpu_type, strict=True) if t == 4)
    assert b200["free_gib"] < total / MIB_PER_GIB


def test_pool_without_a_scheduler_says_how_to_start_one(redis_url: str) -> None:
    result = CliRunner().invoke(pool_command, ["--url", redis_url])
    assert result.exit_code != 0 and "snugfit scheduler" in result.output


def test_parse_record_decodes_fields_and_survives_corruption() -> None:
    rec = parse_record({"id": "x", "spec": "{bad", "attempt": "2", "started_at": "1.5",
                        "simulated": "1"})  # fmt: skip
    assert rec["spec"] is None and rec["_unreadable"] == ["spec"]
    assert rec["attempt"] == 2 and rec["started_at"] == 1.5 and rec["simulated"] is True


def test_explain_a_job_the_live_leader_keeps_pending_prices_its_options_now(
    store: RedisStore, redis_url: str
) -> None:
    from tests.jobs import one_waiting_for_capacity

    waiting = one_waiting_for_capacity(store)
    res = CliRunner().invoke(explain_command, [waiting, "--url", redis_url, "--width", "200"])
    assert res.exit_code == 0, res.output
    assert "Reason=Resources" in res.stdout and "insufficient free H100-80GB" in res.stdout
    assert "not yet considered" not in res.stdout
    assert "priced now, read-only" in res.stderr
