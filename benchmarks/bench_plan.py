"""Benchmark: `snugfit plan` decisions for an 8B chat and a 70B deployment, plus the published
checks of issue 15 (all predicted, i.e. modelled, not measured here).

Writes ``benchmarks/results/plan.json``: for each deployment the chosen option and its
runner-up with every contract number, the options that met the SLO, the planning time, the
latency-throughput frontier and $ per 1M tokens of the cheapest option per GPU type (the data
for the report chart of issue 15 item 6), and the prediction-vs-published table of
``tests/predictor/serving/test_published_orderings.py``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_plan.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from predictor.serving import plan, plan_frontiers, replica_throughput
from predictor.spec import parse_spec
from scheduler.cli.report_serving import DEMO_DEPLOYMENTS
from tests import serving_cases as cases

RESULTS = Path(__file__).resolve().parent / "results"

# The demo report's two deployments (one definition, so the report charts what this measures),
# and the 70B one again with FP4 weights allowed.
DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "chat-8b": DEMO_DEPLOYMENTS["chat-8b"],
    "llama-70b-bf16-fp8": DEMO_DEPLOYMENTS["llama-70b"],
    "llama-70b-fp4-allowed": {
        **DEMO_DEPLOYMENTS["llama-70b"],
        "allowed_weight_dtypes": ["bf16", "fp8", "fp4"],
    },
}


def _deployment(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec({"id": name, **raw})
    t0 = time.perf_counter()
    p = plan(spec)
    elapsed = time.perf_counter() - t0
    contract = p.to_contract()
    meeting = [k for k, o in enumerate(p.options) if o.meets_slo]
    runner = next((k for k in meeting if k != p.chosen), None)
    return {
        "spec": spec.to_dict(),
        "slo": {"ttft_p95_s": spec.slo_ttft_s, "tpot_p95_s": spec.slo_tpot_s},
        "chosen": contract["options"][p.chosen] if p.chosen is not None else None,
        "runner_up": contract["options"][runner] if runner is not None else None,
        "reason": p.reason,
        "engine_flags": p.engine_flags(),
        "frontier_per_gpu_type": plan_frontiers(p),
        "n_options": len(p.options),
        "n_meeting_slo": len(meeting),
        "plan_seconds": round(elapsed, 3),
    }


def _published() -> list[dict[str, Any]]:
    """Same cases as the tests; figure = published, predicted = this model."""
    rows = []

    def add(case: str, predicted: float, figure: float) -> None:
        rows.append(
            {
                "case": case,
                "predicted": float(f"{predicted:.4g}"),
                "published": figure,
                "ratio": round(predicted / figure, 3),
            }
        )

    for gpu, tp, w, figure in (
        ("B200-180GB", 1, "fp4", 7007.0),
        ("H200-141GB", 1, "fp8", 2909.0),
        ("H100-80GB", 2, "fp8", 4205.0),
    ):
        got = replica_throughput("llama-3.3-70b", gpu, tp, w, "fp8", "trtllm", 1000, 1000)
        add(f"TRT-LLM perf overview 70B 1000/1000 {gpu} TP{tp} {w}", got["output_tok_s"], figure)
    per_gpu = {}
    for gpu, w, figure in (("B200-180GB", "fp4", 10755.0), ("H200-141GB", "fp8", 4100.0)):
        p = plan(parse_spec({**cases.MLPERF_70B_SERVER, "gpu": gpu, "weight_dtype": w}))
        per_gpu[gpu] = cases.best_per_gpu_tok_s(p)
        add(f"MLPerf v4.1 Llama-2-70B Server per GPU {gpu} {w}", per_gpu[gpu], figure)
    add(
        "MLPerf v4.1 B200/H200 per-GPU ratio",
        per_gpu["B200-180GB"] / per_gpu["H200-141GB"],
        10755.0 / 4100.0,
    )
    silex = {}
    for gpu, users, figure in (("A100-80GB", 50, 570.0), ("H100-80GB", 500, 7000.0)):
        silex[gpu] = cases.silex_tok_s(gpu, users)
        add(f"Silex 70B bf16 TP4 200/200 {gpu} {users} users", silex[gpu], figure)
    add("Silex H100/A100 ratio", silex["H100-80GB"] / silex["A100-80GB"], 7000.0 / 570.0)
    metrum = {}
    for gpu, figure in (("B200-180GB", 9870.0), ("H200-141GB", 6694.0)):
        metrum[gpu] = cases.metrum_tok_s(gpu)
        add(f"Metrum Maverick vLLM 8x{gpu} 1024 concurrent", metrum[gpu], figure)
    add("Metrum B200/H200 ratio", metrum["B200-180GB"] / metrum["H200-141GB"], 9870.0 / 6694.0)
    for model, gpu, tp, rate, tpot, ttft in cases.SGLANG_VLLM_CASES:
        o = cases.sglang_vllm_option(model, gpu, tp, rate)
        case = f"SGLang bench of vLLM 0.6.0, {model} {tp}x{gpu} {rate:g} req/s"
        add(f"{case}: mean step vs median TPOT (s)", o.point.step_s, tpot)
        add(f"{case}: TTFT p95 vs median TTFT (s)", o.point.ttft_p95_s, ttft)
    return rows


def main() -> None:
    load = os.getloadavg()
    out: dict[str, Any] = {
        "label": "predicted (analytical serving model), not measured",
        "load_average_1m": round(load[0], 2),
        "deployments": {k: _deployment(k, v) for k, v in DEPLOYMENTS.items()},
        "published_checks": _published(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "plan.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, d in out["deployments"].items():
        c, r = d["chosen"], d["runner_up"]
        print(f"{name}: {d['reason']}")
        if r:
            print(
                f"  runner-up: {r['gpu']} {r['mig_profile'] or ''} TP{r['tensor_parallel']} "
                f"{r['weight_dtype']} "
                f"x{r['replicas']} ${r['usd_per_hour']}/h ({r['status']})"
            )
        del c
    for row in out["published_checks"]:
        print(f"  {row['case']}: predicted {row['predicted']} vs {row['published']}")


if __name__ == "__main__":
    main()
