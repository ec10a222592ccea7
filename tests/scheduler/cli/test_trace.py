"""`snugfit trace` and `snugfit predict` answering from the traced tier's cache."""

import json

from click.testing import CliRunner

from predictor.spec import parse_spec
from predictor.traced import TraceCache, fingerprint
from scheduler.cli.predict import predict_command
from scheduler.cli.trace import trace_command
from tests.jobs import TINY_LLAMA

TINY = TINY_LLAMA


def test_trace_reports_excluded_jobs_without_tracing(tmp_path, monkeypatch):
    monkeypatch.setenv("SNUGFIT_HOME", str(tmp_path))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps({"id": "s", "model": TINY, "task": "inference", "framework": "vllm"})
    )
    res = CliRunner().invoke(trace_command, ["--input", str(jobs), "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output.strip().splitlines()[-1])
    assert (row["id"], row["status"]) == ("s", "unsupported")
    assert "vllm" in row["reason"]


def test_plain_predict_answers_from_the_cache_and_never_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("SNUGFIT_HOME", str(tmp_path))
    traced = {"id": "a", "model": TINY, "task": "full_finetune", "seq_len": 64}
    missing = {"id": "b", "model": TINY, "task": "full_finetune", "seq_len": 128}
    breakdown = dict.fromkeys(
        ("weights", "gradients", "optimizer", "activations", "kv_cache", "logits"), 0.5
    )
    summary = {"allocated_gib": 3.0, "reserved_gib": 3.5, "breakdown_gib": breakdown}
    TraceCache().put(fingerprint(parse_spec(traced)), {"status": "ok", "summary": summary})
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(traced) + "\n" + json.dumps(missing) + "\n")
    res = CliRunner().invoke(predict_command, ["--input", str(jobs), "--gpu", "H100-80GB"])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in map(json.loads, res.output.strip().splitlines())}
    assert rows["a"]["method"].startswith("traced")
    assert not rows["b"]["method"].startswith("traced")
