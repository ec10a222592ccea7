"""`snugfit submit` and `snugfit status` against a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from click.testing import CliRunner

from scheduler.cli.service import status_command, submit_command
from scheduler.core.pool import Pool
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "A100-40GB", "count": 1}]})


def _job_file(tmp_path: Path, *jobs: dict[str, object]) -> Path:
    f = tmp_path / "jobs.jsonl"
    f.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return f


def test_submit_of_a_job_that_fits_nowhere_exits_non_zero_with_the_closest_option(
    redis_url: str, tmp_path: Path
) -> None:
    SchedulerService(RedisStore(redis.Redis.from_url(redis_url)), POOL).step()  # publishes it
    big = spec("big", model="llama-3.1-70b")
    got = CliRunner().invoke(
        submit_command, [str(_job_file(tmp_path, spec("ok"), big)), "--redis", redis_url]
    )
    assert got.exit_code == 1, got.output
    assert "job-ok" in got.output and "job-big" in got.output  # both submitted, ids printed
    assert "'job-big' fits no GPU of pool 'one'" in got.output
    assert "GiB short per GPU" in got.output and "job-ok' fits" not in got.output


def test_submit_of_an_empty_file_fails(redis_url: str, tmp_path: Path) -> None:
    f = tmp_path / "empty.yaml"
    f.write_text("")
    got = CliRunner().invoke(submit_command, [str(f), "--redis", redis_url])
    assert got.exit_code != 0 and "holds no jobs" in got.output


def test_status_json_is_typed(redis_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    job_file = str(_job_file(tmp_path, spec(1)))
    assert runner.invoke(submit_command, [job_file, "--redis", redis_url]).exit_code == 0
    got = runner.invoke(status_command, ["job-1", "--json", "--redis", redis_url])
    assert got.exit_code == 0, got.output
    rec = json.loads(got.output)
    assert isinstance(rec["spec"], dict) and rec["spec"]["id"] == "job-1"
    assert isinstance(rec["request"]["vram_gib"], list)
    assert isinstance(rec["submitted_at"], float) and rec["attempt"] == 0
