"""Accuracy benchmark: analytical vs traced vs learned vs history on measured data only.

Learned and history figures are grouped cross-validation by source (a setup never seen). The
analytical tier's time figures use efficiency tables fitted leave-one-source-out
(``analytical``); ``analytical_prior`` is the same roofline with every efficiency at its quoted
prior (nothing fitted), for comparison. The learned tier is cross-validated on top of the
out-of-source analytical predictions.
traced tier fits nothing, so it is scored directly, over all peak-VRAM rows and over the rows
it covers; its traces are cached under ``$SNUGFIT_HOME`` (the first run traces ~60 jobs).
Writes ``benchmarks/results/eval.json``. Run: ``.venv/bin/python benchmarks/bench_eval.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from predictor._fit import OutOfSourceAnalytical, out_of_source_values
from predictor._runtime import RuntimeModel
from predictor.analytical import AnalyticalPredictor
from predictor.efficiency import prior_efficiencies
from predictor.evaluation import evaluate
from predictor.history import cross_validate_history
from predictor.learned import cross_validate
from predictor.measurements import load_measurements
from predictor.traced import is_available
from predictor.traced.evaluation import traced_reports, warm_measured


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


def main() -> None:
    t0 = time.perf_counter()
    ms = load_measurements()
    pv, tables = out_of_source_values(ms)
    reports = [
        evaluate(ms, pv, tier="analytical"),
        evaluate(
            ms,
            AnalyticalPredictor(runtime_model=RuntimeModel(prior_efficiencies())),
            tier="analytical_prior",
        ),
    ]
    oos = OutOfSourceAnalytical.from_measurements(ms, tables)
    base: Any = oos
    if is_available():
        reports += traced_reports(ms, workers=2)
        base = warm_measured(ms, workers=2, analytical=oos)
    cv = cross_validate(ms, n_splits=5, base=base)
    reports.append(cv.report)
    reports.append(cross_validate_history(ms))
    wall_s = time.perf_counter() - t0
    out = Path(__file__).parent / "results" / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "n_measurements": len(ms),
        "wall_s": round(wall_s, 2),
        "learned_vs_analytical_grouped_cv": cv.comparison,
        "learned_fallback": cv.fallback,
        "analytical_note": "time metrics out of source: efficiencies fitted leave-one-source-out",
        "uptime_load": _load(),
        "coverage_targets": {"peak_vram_gib": 0.95, "time": 0.90},
        "coverage_by_trust": {
            r.tier: {m: {k: v.to_dict() for k, v in d.items()} for m, d in r.by_trust.items()}
            for r in reports
        },
        "summary": {
            r.tier: {
                **{m: s.to_dict() for m, s in r.overall.items()},
                "cross_gpu_ratio": r.ratio_summary,
            }
            for r in reports
        },
        "reports": [r.to_dict() for r in reports],
    }
    out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    print(f"wrote {out} in {wall_s:.1f} s")
    for r in reports:
        for m, s in r.overall.items():
            trusted = r.by_trust.get(m, {}).get("calibration")
            cov_t = f" cov(calibration rows)={trusted.coverage:6.1%}" if trusted else ""
            print(
                f"{r.tier:10s} {m:14s} n={s.n:4d} MAPE={s.mape:6.1%} median={s.median_ape:6.1%} "
                f"cov={s.coverage:6.1%} headroom={s.mean_headroom:6.1%}{cov_t}"
            )


if __name__ == "__main__":
    main()
