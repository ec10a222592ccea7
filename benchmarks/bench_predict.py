"""Benchmark: `snugfit predict` throughput, analytical tier, 10,000 jobs × 5 GPU types.

Goal (issue #2): ≤ 3 s on the 2-core dev machine, end to end from JSONL parsing to
Prediction objects. Writes ``benchmarks/results/predict.json``.

    .venv/bin/python benchmarks/bench_predict.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from predictor.analytical import predict_table
from predictor.gpus import GPU_NAMES
from predictor.spec import parse_spec

RESULTS = Path(__file__).resolve().parent / "results"

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
    out = "".join(json.dumps(r) + "\n" for r in rows)
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
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "predict.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
