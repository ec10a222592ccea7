"""Benchmark: what the leader's retraining process decides, and how long it takes.

Two cases, the ones ``tests/scheduler/service/test_retrain.py`` asserts: 24 of the published
peak-VRAM runs (on catalogue GPUs) measured again by workers on two nodes, once agreeing with
the published peaks and once reporting twice the peak (a broken memory reading). Each is run
twice: on the 64 published peak-VRAM rows (the test's data) and on every published row (the
service's default). The retraining process's own function runs in this process against real
Redis (``SNUGFIT_REDIS_URL``, else 127.0.0.1:6379) under a private key prefix, deleted after;
``$SNUGFIT_HOME`` is a temporary directory holding a copy of the shipped artifact.

Writes ``benchmarks/results/retrain.json``: per case the decision, its reason, the grouped-CV
figures (``analytical_mape``, ``incumbent_mape``, ``candidate_mape``) and the seconds it took.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_retrain.py
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
N = 24


def published_vram() -> list[dict[str, Any]]:
    path = ROOT / "datasets" / "measured" / "published.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if r.get("peak_vram_gib") is not None]


def history_rows(factor: float, n: int = N) -> list[str]:
    """``n`` published runs on catalogue GPUs measured again on two nodes, peaks × ``factor``."""
    out = []
    runs = [r for r in published_vram() if isinstance(r.get("gpu"), str)]
    for i, r in enumerate(runs[:n]):
        node = f"n{i % 2}"
        row = dict(r, id=f"hist-{factor}-{i}", origin="history", simulated=False)
        row["source"] = f"snugfit worker w-{node} node {node}, job re-{i}@1"
        row["hardware"] = {"node": node}
        row["peak_vram_gib"] = round(r["peak_vram_gib"] * factor, 3)
        out.append(json.dumps(row))
    return out


def run_case(url: str, factor: float, data: list[str]) -> dict[str, Any]:
    from predictor.artifact import default_artifact_path
    from scheduler.service._retrain_child import retrain

    prefix = f"bench-retrain-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(url)
    home = Path(tempfile.mkdtemp(prefix="snugfit-bench-retrain-"))
    try:
        (home / "artifacts").mkdir()
        shutil.copy(default_artifact_path(), home / "artifacts" / "learned.json")
        os.environ["SNUGFIT_HOME"] = str(home)
        os.environ["SNUGFIT_REDIS_URL"] = url
        r.rpush(f"{prefix}:history", *history_rows(factor))
        job = {
            "artifact": str(home / "artifacts" / "learned.json"),
            "prefix": prefix,
            "data": data,
            "folds": 5,
            "trained_offset": 0,
        }
        return retrain(job)
    finally:
        r.delete(f"{prefix}:history")
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    url = os.environ.get("SNUGFIT_REDIS_URL") or "redis://127.0.0.1:6379/0"
    tmp = Path(tempfile.mkdtemp(prefix="snugfit-bench-retrain-data-"))
    vram = tmp / "published-vram.jsonl"
    vram.write_text("".join(json.dumps(r) + "\n" for r in published_vram()), encoding="utf-8")
    out: dict[str, Any] = {"load_average": os.getloadavg(), "cases": {}}
    for data_name, data in (("published_vram_rows", [str(vram)]), ("all_published_rows", [])):
        for name, factor in (("agreeing", 1.0), ("doubled_peaks", 2.0)):
            got = run_case(url, factor, data)
            got.pop("pid", None)
            out["cases"][f"{data_name}/{name}"] = got
            print(f"{data_name}/{name}: {got['reason']} ({got['seconds']} s)")
    shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "retrain.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
