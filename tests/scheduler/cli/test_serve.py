"""`snugfit submit` of a serve spec, `snugfit serve scale/status`, and `snugfit explain` of a
deployment (the plan table with the chosen row), on a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler.cli import cli
from scheduler.core.pool import Pool
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore

POOL = Pool.from_dict(
    {"name": "serve-cli", "nodes": [{"name": "h100-a", "gpu": "H100-80GB", "count": 8}]}
)


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    SchedulerService(RedisStore(redis.Redis.from_url(redis_url)), POOL).step()
    return {"SNUGFIT_REDIS_URL": redis_url}


def test_submit_scale_status_explain_cancel(tmp_path: Path, env: dict[str, str]) -> None:
    run = CliRunner(env=env).invoke
    f = tmp_path / "serve.yaml"
    f.write_text("{id: chat, model: llama-3.1-8b, task: serve, request_rate: 40}\n")
    res = run(cli, ["submit", str(f)])
    assert res.exit_code == 0 and res.output.strip() == "chat", res.output
    res = run(cli, ["serve", "status", "chat", "--json"])
    assert res.exit_code == 0, res.output
    (view,) = json.loads(res.output)
    assert view["state"] == "active" and view["option"]["gpu"] == "H100-80GB"
    n = view["replicas"]
    res = run(cli, ["serve", "scale", "chat", "--rate", "400", "--json"])
    assert res.exit_code == 0, res.output
    scaled = json.loads(res.output)
    assert scaled["replicas_before"] == n and scaled["replicas"] > n
    assert len(scaled["added"]) == scaled["replicas"] - n
    res = run(cli, ["explain", "chat", "--width", "220"])
    assert res.exit_code == 0, res.output
    assert "snugfit plan chat" in res.output and "CHOSEN" in res.output
    assert "vllm serve" in res.output and f"{scaled['replicas']} replica(s)" in res.output
    # The planner's own pick (a MIG slice or another type) is not in this H100-only pool.
    assert "not in this pool" in res.output and res.output.count("CHOSEN") == 1
    res = run(cli, ["serve", "scale", "chat", "--rate", "0"])
    assert res.exit_code == 0 and "cold start" in res.output, res.output
    res = run(cli, ["cancel", "chat"])
    assert res.exit_code == 0 and "cancelled" in res.output
    res = run(cli, ["serve", "scale", "chat", "--rate", "1"])
    assert res.exit_code != 0 and "is cancelled" in res.output


def test_unservable_spec_is_one_clear_error(tmp_path: Path, env: dict[str, str]) -> None:
    f = tmp_path / "serve.yaml"
    f.write_text("{model: llama-3.1-8b, task: serve, request_rate: 2, slo_tpot_s: 0.0005}\n")
    res = CliRunner(env=env).invoke(cli, ["submit", str(f)])
    assert res.exit_code != 0 and "cannot be placed" in res.output and "slo_tpot_s" in res.output
