"""`snugfit submit --array`, `queue`, `acct`, `hold`, `release` and `requeue` against a real
Redis, with the leader and simulated workers of the demo pool running the jobs in process."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from scheduler.cli import cli
from scheduler.service.client import Client
from scheduler.service.store.redis_store import RedisStore
from tests.scheduler.service._simpool import SimPool

JOB = """\
id: sweep-{index}
model: llama-3.1-8b
task: inference
batch_size: 4
num_requests: 16
team: nlp
command: [python, eval.py, --shard, "{index}"]
"""


def _run(url: str, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, [*args, "--redis", url])
    return res.exit_code, res.stdout, res.stderr


def test_array_chain_queue_hold_release_requeue_and_acct(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    code, out, err = _run(redis_url, "submit", "--array", "0-4:2", "--chain", str(job))
    assert code == 0, err
    assert out.split() == ["sweep-0", "sweep-2", "sweep-4"]

    code, out, _ = _run(redis_url, "queue")
    lines = out.splitlines()
    assert lines[0].split() == ["JOBID", "USER", "TEAM", "STATE", "OPTION", "NODE", "ELAPSED",
                                "PRED_LEFT", "REASON"]  # fmt: skip
    assert "Dependency: waiting on job sweep-2 (pending) to succeed" in lines[3]
    assert lines[3].split()[:4] == ["sweep-4", lines[1].split()[1], "nlp", "PENDING"]

    code, out, err = _run(redis_url, "hold", "sweep-0", "nope")
    assert code == 1 and "sweep-0: held" in out and "nope: no such job" in err
    rows = json.loads(_run(redis_url, "queue", "--json", "sweep-0")[1])
    assert rows[0]["held"] is True and rows[0]["remaining_s"] > 0
    assert rows[0]["reason"].startswith("JobHeldUser")
    code, out, _ = _run(redis_url, "explain", "sweep-0", "--width", "200")
    assert code == 0 and "Reason=JobHeldUser: held by user" in out
    out = _run(redis_url, "explain", "sweep-2", "--width", "200")[1]
    assert "Reason=Dependency: waiting on job sweep-0" in out
    assert _run(redis_url, "release", "sweep-0")[:2] == (0, "sweep-0: released\n")
    code, _, err = _run(redis_url, "release", "sweep-0")
    assert code == 1 and "it is not held" in err

    client = Client(store=store)
    SimPool(store, tmp_path).run_until_idle(client)
    assert client.counts()["succeeded"] == 3
    code, out, _ = _run(redis_url, "queue", "--state", "succeeded", "--team", "nlp")
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == ["sweep-0", "sweep-2", "sweep-4"]
    assert _run(redis_url, "queue", "--user", "nobody")[1].splitlines()[1:] == []

    code, out, _ = _run(redis_url, "acct", "--json")
    got = json.loads(out)
    assert got["total"]["jobs"] == 3 and got["total"]["cost_usd"] > 0
    assert all(isinstance(j["gpu_hours"], float) for j in got["jobs"])
    code, out, _ = _run(redis_url, "acct", "--by", "team", "--since", "1h")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["TEAM", "JOBS", "ATTEMPTS"]
    assert out.splitlines()[2].split()[:3] == ["nlp", "3", "3"]
    code, out, _ = _run(redis_url, "acct", "--until", "2000-01-01")
    assert "total: 0 jobs, 0 attempts" in out
    code, _, err = _run(redis_url, "acct", "--since", "yesterday")
    assert code != 0 and "not understood" in err

    assert _run(redis_url, "requeue", "sweep-4")[:2] == (0, "sweep-4: requeued\n")
    assert client.get("sweep-4").status() == "pending"
    code, _, err = _run(redis_url, "requeue", "sweep-4")
    assert code == 1 and "already pending" in err


def test_chain_needs_array(redis_url: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    code, _, err = _run(redis_url, "submit", "--chain", str(job))
    assert code == 2 and "--chain needs --array" in err


def test_job_commands_follow_the_output_rule(redis_url: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    assert _run(redis_url, "submit", "--array", "0-1", str(job))[0] == 0
    # In a pipe (CliRunner's stdout is not a terminal): tab-separated, one header, no padding.
    out = _run(redis_url, "queue")[1].splitlines()
    assert out[0].split("\t")[:3] == ["JOBID", "USER", "TEAM"] and len(out) == 3
    assert all(len(line.split("\t")) == 9 for line in out)
    table = _run(redis_url, "queue", "--format", "table")[1].splitlines()
    assert "\t" not in table[0] and table[0].split()[0] == "JOBID"
    acct = _run(redis_url, "acct")[1].splitlines()
    assert acct[0].startswith("# attempts ended from") and acct[-1].startswith("# total: 0 jobs")
    code, out, _ = _run(redis_url, "hold", "sweep-0", "nope", "--json")
    assert code == 1
    assert json.loads(out) == [
        {"id": "sweep-0", "result": "held", "ok": True, "error": None},
        {"id": "nope", "result": "missing", "ok": False,
         "error": "no such job; list jobs with `snugfit queue`"},
    ]  # fmt: skip
    assert json.loads(_run(redis_url, "release", "sweep-0", "--json")[1])[0]["ok"] is True
