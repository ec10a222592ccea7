"""Benchmark: `snugfit predict` throughput, analytical tier, 10,000 jobs × 5 GPU types.

Goal (issue #2): ≤ 3 s on the 2-core dev machine, end to end from JSONL parsing to
Prediction objects. Writes ``benchmarks/results/predict.json``.

It also times ``snugfit predict`` as a whole process (issue 10: ≤ 3 s including interpreter
start and imports, default tier), records its CPU seconds and the load average (the machine
may be shared), and lists which heavy modules (``python -X importtime``) the command imported.

    .venv/bin/python benchmarks/bench_predict.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from predictor.analytical import predict_table
from predictor.gpus import GPU_NAMES
from predictor.spec import parse_spec

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
HEAVY = ("lightgbm", "sklearn", "rq", "redis", "rich", "torch", "scipy", "pandas")

MODELS = [
    "llama-3.1-8b",
    "qwen2.5-7b",
    "mistral-7b",
    "llama-3.2-3b",
    "qwen2.5-0.5b",
    "llama-3.1-70b",
    "mixtral-8x7b",
    "gemma-2-9b",
    "phi-3-mini",
    "gpt2",
]


def make_jobs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        task = rng.choice(["inference", "full_finetune", "lora", "qlora", "pretrain"])
        job: dict = {
            "id": f"j{i}",
            "model": rng.choice(MODELS),
            "task": task,
            "batch_size": rng.choice([1, 2, 4, 8, 16, 32]),
        }
        if task == "inference":
            job |= {
                "input_len": rng.choice([128, 512, 2048]),
                "output_len": rng.choice([64, 256]),
                "num_requests": rng.choice([100, 1000]),
            }
        else:
            job |= {
                "seq_len": rng.choice([512, 2048, 4096]),
                "steps": rng.choice([100, 1000]),
                "gradient_checkpointing": rng.random() < 0.5,
            }
        jobs.append(job)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    args = ap.parse_args()
    raw = make_jobs(args.jobs)
    lines = [json.dumps(j) for j in raw]
    t0 = time.perf_counter()
    specs = [parse_spec(json.loads(line)) for line in lines]
    t1 = time.perf_counter()
    table = predict_table(specs, GPU_NAMES)
    t2 = time.perf_counter()
    rows = list(table.iter_dicts())
    out = b"".join(orjson.dumps(r) + b"\n" for r in rows)  # as `snugfit predict` writes it
    t3 = time.perf_counter()
    result = {
        "benchmark": "predict_analytical",
        "jobs": args.jobs,
        "gpu_types": len(GPU_NAMES),
        "predictions": len(rows),
        "parse_s": round(t1 - t0, 3),
        "predict_table_s": round(t2 - t1, 3),
        "serialise_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3),
        "goal_total_s": 3.0,
        "output_bytes": len(out),
    }
    result["whole_process"] = whole_process(lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "predict.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def whole_process(lines: list[str], runs: int = 3) -> dict:
    """``snugfit predict --input jobs.jsonl --output preds.jsonl`` as a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", "from scheduler.cli import main; main()", "predict"]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp) / "jobs.jsonl"
        jobs.write_text("".join(line + "\n" for line in lines))
        cmd = [*argv, "--input", str(jobs), "--output", str(Path(tmp) / "preds.jsonl")]
        walls, cpus, loads = [], [], []
        for _ in range(runs):
            loads.append(round(os.getloadavg()[0], 2))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            walls.append(round(time.perf_counter() - t0, 3))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(
                round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3)
            )
        # Which heavy modules the command really loaded (sys.modules at exit).
        probe = (
            "import atexit, sys; atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join("
            f"m for m in {HEAVY!r} if sys.modules.get(m)) + chr(10))); "
            "from scheduler.cli import main; main()"
        )
        err = subprocess.run(
            [sys.executable, "-c", probe, *cmd[3:]], env=env, capture_output=True, text=True
        ).stderr
    line = next((ln for ln in err.splitlines() if ln.startswith("MODULES")), "MODULES ?")
    seen = set(line.split()[1:])
    return {
        "command": "snugfit predict --input jobs.jsonl --output preds.jsonl",
        "wall_s": walls,
        "best_wall_s": min(walls),
        "cpu_s": cpus,
        "load_avg_1m": loads,
        "heavy_modules_loaded": sorted(seen),
        "goal_wall_s": 3.0,
    }


if __name__ == "__main__":
    main()
