"""Per-row peak-VRAM diagnosis: measured vs traced vs analytical on every measured VRAM row.

For each row that measured peak VRAM: the measured value and what it counts (allocated,
reserved, nvml_used, unknown), the traced and analytical predictions already adjusted to that
kind (as ``snugfit eval`` compares them), the traced breakdown at the peak, the row's source,
task and framework, and whether the traced tier covers it (else why not). Then MAPE per source,
task, framework and kind for both tiers, and each row's share of the total absolute error, so
the rows that dominate the MAPE are named; and ``subsets``: MAPE and the grouped-CV conformal
bound's coverage and headroom on all / covered / calibration rows, with and without the
flagged (quirk or failed-check) rows.

Traces what the cache lacks first (``$SNUGFIT_HOME/traces``). Writes
``benchmarks/results/vram_rows.json``. Run::

    SNUGFIT_HOME=... .venv/bin/python benchmarks/bench_vram_rows.py [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from predictor.analytical import AnalyticalPredictor
from predictor.evaluation import predicted_values, source_group
from predictor.measurements import calibration_exclusion, is_quirk, load_measurements
from predictor.traced import TracedPredictor, trace_specs
from predictor.traced.evaluation import conformal_by_source

RESULTS = Path(__file__).resolve().parent / "results"


def _mape(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([abs(r[key] / r["measured"] - 1.0) for r in rows]))


def _groups(rows: list[dict[str, Any]], field: str) -> dict[str, dict[str, float]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[str(r[field])].append(r)
    return {
        k: {
            "n": len(v),
            "traced_mape": round(_mape(v, "traced"), 4),
            "analytical_mape": round(_mape(v, "analytical"), 4),
            "traced_bias": round(float(np.median([r["traced"] / r["measured"] - 1 for r in v])), 4),
        }
        for k, v in sorted(by.items())
    }


def _subsets(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Traced MAPE and the grouped-CV conformal bound's coverage and headroom (upper /
    measured − 1, and upper / point − 1) on all rows, covered rows, and each without the
    flagged (quirk or failed-check) rows or with calibration rows only."""
    picks = {
        "all": lambda r: True,
        "covered": lambda r: r["covered"],
        "all, not flagged": lambda r: not r["flagged"],
        "covered, not flagged": lambda r: r["covered"] and not r["flagged"],
        "calibration": lambda r: r["calibration"],
        "covered calibration": lambda r: r["covered"] and r["calibration"],
    }
    out: dict[str, dict[str, float]] = {}
    for name, keep in picks.items():
        sub = [r for r in rows if keep(r)]
        m = np.array([r["measured"] for r in sub])
        p = np.array([r["traced"] for r in sub])
        u = np.array([r["conformal_upper"] for r in sub])
        out[name] = {
            "n": len(sub),
            "traced_mape": round(float(np.mean(np.abs(p / m - 1))), 4),
            "coverage": round(float(np.mean(u >= m)), 4),
            "upper_over_measured_minus_1": round(float(np.mean(u / m - 1)), 4),
            "upper_over_point_minus_1": round(float(np.mean(u / p - 1)), 4),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    ms = [m for m in load_measurements() if m.peak_vram_gib is not None]
    outs = trace_specs([m.spec for m in ms], workers=args.workers)
    traced = predicted_values(ms, TracedPredictor())
    bound = conformal_by_source(ms, traced, [o.traced for o in outs]).upper["peak_vram_gib"]
    analytical = predicted_values(ms, AnalyticalPredictor())
    rows: list[dict[str, Any]] = []
    for i, (m, o) in enumerate(zip(ms, outs, strict=True)):
        s = o.summary or {}
        fw = m.spec.framework.value if m.spec.framework else None
        rows.append(
            {
                "id": m.id,
                "source": source_group(m),
                "task": m.spec.task.value,
                "framework": fw,
                "kind": m.measurement,
                "model": m.spec.model_name,
                "n_gpus": m.spec.n_gpus,
                "confidence": m.confidence,
                "calibration": calibration_exclusion(m) is None,
                "measured": round(float(m.peak_vram_gib or 0.0), 3),
                "traced": round(float(traced.point["peak_vram_gib"][i]), 3),
                "traced_upper": round(float(traced.upper["peak_vram_gib"][i]), 3),
                "conformal_upper": round(float(bound[i]), 3),
                "flagged": is_quirk(m),
                "analytical": round(float(analytical.point["peak_vram_gib"][i]), 3),
                "covered": o.traced,
                "status": o.status,
                "reason": o.reason.splitlines()[0][:160] if o.reason else "",
                "trace_allocated_gib": round(float(s.get("allocated_gib", 0.0)), 3),
                "trace_reserved_gib": round(float(s.get("reserved_gib", 0.0)), 3),
                "trace_breakdown_gib": {
                    k: round(float(v), 3) for k, v in s.get("breakdown_gib", {}).items()
                },
            }
        )
    total_err = sum(abs(r["traced"] - r["measured"]) / r["measured"] for r in rows) or 1.0
    for r in rows:
        r["traced_ape"] = round(abs(r["traced"] / r["measured"] - 1.0), 4)
        r["share_of_traced_error"] = round(r["traced_ape"] / total_err, 4)
    covered = [r for r in rows if r["covered"]]
    doc = {
        "benchmark": "vram_rows",
        "wall_s": round(time.perf_counter() - t0, 1),
        "n_rows": len(rows),
        "n_covered": len(covered),
        "overall": {
            "all_rows": {
                "traced_mape": _mape(rows, "traced"),
                "analytical_mape": _mape(rows, "analytical"),
            },
            "covered_rows": {
                "traced_mape": _mape(covered, "traced") if covered else None,
                "analytical_mape": _mape(covered, "analytical") if covered else None,
            },
        },
        "subsets": _subsets(rows),
        "covered_by": {f: _groups(covered, f) for f in ("source", "task", "framework", "kind")},
        "all_by": {f: _groups(rows, f) for f in ("source", "task", "framework", "kind")},
        "rows": sorted(rows, key=lambda r: -r["traced_ape"]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vram_rows.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        print(
            f"{r['id']:16s} {r['source'][:28]:28s} {r['task']:13s} {r['framework']!s:9s} "
            f"{r['kind']:9s} meas={r['measured']:7.2f} tr={r['traced']:7.2f} "
            f"an={r['analytical']:7.2f} ape={r['traced_ape']:6.1%} {'' if r['covered'] else 'NC'}"
        )
    print(json.dumps(doc["overall"], indent=1))
    for name, d in doc["subsets"].items():
        print(
            f"{name:22s} n={d['n']:3d} traced MAPE={d['traced_mape']:6.1%} "
            f"conformal cov={d['coverage']:6.1%} upper/measured-1="
            f"{d['upper_over_measured_minus_1']:6.1%} upper/point-1="
            f"{d['upper_over_point_minus_1']:6.1%}"
        )


if __name__ == "__main__":
    main()
