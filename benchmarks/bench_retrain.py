"""Benchmark: what the leader's retraining process decides, and how long it takes.

24 of the published peak-VRAM runs on catalogue GPUs are measured again by workers on two nodes
(``n0`` and ``n1``, alternating) and appended to the history, as in
``tests/scheduler/service/test_retrain.py``. Honest cases, which the gate must accept: the same
peaks (``agreeing``), the same peaks with ±5% measurement noise (``noise_5pct``), and 20
published runs the incumbent never saw, withheld from the published rows (``withheld_published``:
new information, honestly measured). Broken cases, which it must reject: peaks doubled,
tripled, times 0.4, contradictory (``n0`` 2×, ``n1`` 0.5×) and random (5× or 0.2× per row).
A sweep of uniform factors (1.1× to 1.5×) shows where the gate starts to see a bias, and
``NULL_DRAWS`` random honest withholdings of 24 runs measure how often it holds back honest rows
(``null_draws``).

Every case runs twice: on the 64 published peak-VRAM rows (the test's data) and on every
published row (the service's default). The retraining process's own function runs in this
process against real Redis (``SNUGFIT_REDIS_URL``, else 127.0.0.1:6379) under a private key
prefix, deleted after; ``$SNUGFIT_HOME`` is a temporary directory holding a copy of the
shipped artifact.

Writes ``benchmarks/results/retrain.json``: per case the decision, its reason, the grouped-CV
figures (MAPEs, the paired test's ``worse_p``, each node's consistency ``p``) and the seconds
it took.

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

import numpy as np
import redis

from tests.retrain_cases import BROKEN, HONEST, Factor, N, published_vram, remeasured

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _uniform(x: float) -> Factor:
    return lambda i, node: x


SWEEP = (1.1, 1.2, 1.3, 1.5)
#: Random honest draws for the false-rejection rate: each withholds N random catalogue-GPU runs
#: from the published rows and brings them back as history (new rows exchangeable with the old).
NULL_DRAWS = 40


def history_rows(factor: Factor, runs: list[dict[str, Any]] | None = None) -> list[str]:
    """``N`` published runs on catalogue GPUs measured again on two nodes, peaks × ``factor``."""
    runs = runs or [r for r in published_vram() if isinstance(r.get("gpu"), str)][:N]
    return [
        remeasured(r, i, factor, f"hist-{uuid.uuid4().hex[:6]}-{i}") for i, r in enumerate(runs)
    ]


def run_case(url: str, rows: list[str], data: list[str]) -> dict[str, Any]:
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
        r.rpush(f"{prefix}:history", *rows)
        job = {
            "artifact": str(home / "artifacts" / "learned.json"),
            "prefix": prefix,
            "data": data,
            "folds": 5,
            "trained_offset": 0,
        }
        got = retrain(job)
        got.pop("pid", None)
        return got
    finally:
        r.delete(f"{prefix}:history")
        shutil.rmtree(home, ignore_errors=True)


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _datasets(tmp: Path) -> dict[str, tuple[list[str], list[str], list[dict[str, Any]]]]:
    """Per data set: (published files, files without the withheld runs, the withheld runs)."""
    from predictor.measurements import default_measurement_paths

    vram = published_vram()
    # Withheld: every second run on a catalogue GPU, up to N (spread over the sources).
    withheld = [r for r in vram if isinstance(r.get("gpu"), str)][::2][:N]
    ids = {r["id"] for r in withheld}
    everything = []
    for p in default_measurement_paths():
        lines = [x.strip() for x in p.read_text(encoding="utf-8").splitlines()]
        everything += [json.loads(x) for x in lines if x and not x.startswith("#")]
    return {
        "published_vram_rows": (
            [_write(tmp / "vram.jsonl", vram)],
            [_write(tmp / "vram-withheld.jsonl", [r for r in vram if r["id"] not in ids])],
            withheld,
        ),
        "all_published_rows": (
            [],
            [_write(tmp / "all-withheld.jsonl", [r for r in everything if r["id"] not in ids])],
            withheld,
        ),
    }


def null_draws(url: str, tmp: Path) -> dict[str, Any]:
    """How often the gate holds back honest new rows (its false-rejection rate, <= ALPHA if the
    rows are exchangeable): NULL_DRAWS random withholdings on the 64 peak-VRAM rows."""
    vram = published_vram()
    runs = [r for r in vram if isinstance(r.get("gpu"), str)]
    reasons = []
    for k in range(NULL_DRAWS):
        pick = np.random.default_rng(k).choice(len(runs), size=N, replace=False)
        ids = {runs[int(j)]["id"] for j in pick}
        rest = _write(tmp / f"null-{k}.jsonl", [r for r in vram if r["id"] not in ids])
        got = run_case(url, history_rows(lambda i, n: 1.0, [runs[int(j)] for j in pick]), [rest])
        reasons.append({"accepted": got["accepted"], "reason": got["reason"]})
    return {
        "draws": NULL_DRAWS,
        "rejected": sum(not r["accepted"] for r in reasons),
        "decisions": reasons,
    }


def main() -> None:
    url = os.environ.get("SNUGFIT_REDIS_URL") or "redis://127.0.0.1:6379/0"
    tmp = Path(tempfile.mkdtemp(prefix="snugfit-bench-retrain-data-"))
    out: dict[str, Any] = {"load_average": os.getloadavg(), "cases": {}}
    cases: dict[str, tuple[str, Factor]] = {
        **{k: ("accept", f) for k, f in HONEST.items()},
        **{k: ("reject", f) for k, f in BROKEN.items()},
        **{f"sweep_{x}x": ("either", _uniform(x)) for x in SWEEP},
    }
    for data_name, (data, data_withheld, withheld) in _datasets(tmp).items():
        runs: dict[str, tuple[str, list[str], list[str]]] = {
            name: (want, history_rows(f), data) for name, (want, f) in cases.items()
        }
        runs["withheld_published"] = ("accept", history_rows(lambda i, n: 1.0, withheld),
                                      data_withheld)  # fmt: skip
        for name, (want, rows, files) in runs.items():
            got = run_case(url, rows, files)
            got["expected"] = want
            out["cases"][f"{data_name}/{name}"] = got
            ok = want == "either" or got["accepted"] == (want == "accept")
            print(f"{data_name}/{name}: {'ok' if ok else 'WRONG'} {got['reason']} "
                  f"({got['seconds']} s)")  # fmt: skip
    out["null_draws"] = null_draws(url, tmp)
    print(f"honest random withholdings rejected: {out['null_draws']['rejected']} of {NULL_DRAWS}")
    shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "retrain.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
