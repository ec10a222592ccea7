"""Accuracy benchmark: analytical vs traced vs learned vs history on measured data only.

Learned and history figures are grouped cross-validation by source (a setup never seen). The
analytical tier's time figures use efficiency tables fitted leave-one-source-out
(``analytical``); ``analytical_prior`` is the same roofline with every efficiency at its quoted
prior (nothing fitted), for comparison. The learned tier is cross-validated on top of the
out-of-source analytical predictions.
traced tier fits nothing, so it is scored directly, over all peak-VRAM rows and over the rows
it covers; its traces are cached under ``$SNUGFIT_HOME`` (the first run traces ~60 jobs).
Writes ``benchmarks/results/eval.json`` and, for the analytical tier, every row's error with the
job's shape (source, GPU, model, task, framework, batch, lengths, TP/PP) to
``benchmarks/results/eval_rows.jsonl``, so the groups that dominate the error can be read off.
``analytical_subsets`` repeats the analytical summary without Splitwise (the one source whose
rows cannot all be modelled from what it documents; see README) and on the calibration rows
(those that pass the data checks and are not low-confidence), each labelled.
Run: ``.venv/bin/python benchmarks/bench_eval.py``.
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
from predictor.evaluation import EvalReport, PredictedValues, evaluate, source_group
from predictor.history import cross_validate_history
from predictor.learned import cross_validate
from predictor.measurements import Measurement, calibration_exclusion, load_measurements
from predictor.traced import is_available
from predictor.traced.evaluation import traced_reports, warm_measured


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


#: The source reported with and without (README explains why its rows are not all modellable).
SPLITWISE = "splitwise_perf_model"


def _subset(
    ms: list[Measurement], pv: PredictedValues, keep: Any
) -> tuple[list[Measurement], PredictedValues]:
    idx = [i for i, m in enumerate(ms) if keep(m)]
    return [ms[i] for i in idx], PredictedValues(
        {k: v[idx] for k, v in pv.point.items()},
        {k: v[idx] for k, v in pv.upper.items()},
        tuple(pv.gpu_column[i] for i in idx),
        pv.unexpressed,
    )


def _subsets(ms: list[Measurement], pv: PredictedValues) -> dict[str, Any]:
    subsets = {
        "all rows": lambda m: True,
        "without splitwise_perf_model": lambda m: source_group(m) != SPLITWISE,
        "calibration rows (pass the data checks, not low-confidence)": lambda m: (
            calibration_exclusion(m) is None
        ),
        "calibration rows, without splitwise_perf_model": lambda m: (
            calibration_exclusion(m) is None and source_group(m) != SPLITWISE
        ),
        "only splitwise_perf_model": lambda m: source_group(m) == SPLITWISE,
    }
    out: dict[str, Any] = {}
    for label, keep in subsets.items():
        r = evaluate(*_subset(ms, pv, keep), tier="analytical")
        out[label] = {
            **{m: s.to_dict() for m, s in r.overall.items() if m != "peak_vram_gib"},
            "cross_gpu_ratio": r.ratio_summary,
        }
    return out


def _write_rows(ms: list[Measurement], report: EvalReport, path: Path) -> None:
    by_id = {m.id: m for m in ms}
    with path.open("w") as f:
        for r in report.rows:
            s = by_id[r.id].spec
            row = {
                "id": r.id,
                "source": source_group(by_id[r.id]),
                "gpu": r.gpu,
                "metric": r.metric,
                "measured": r.measured,
                "predicted": r.predicted,
                "ratio": round(r.predicted / r.measured, 4),
                "calibratable": r.calibratable,
                "model": s.model_name,
                "task": s.task.value,
                "framework": s.framework.value if s.framework else None,
                "batch": s.batch_size,
                "seq_len": s.seq_len,
                "input_len": s.input_len,
                "output_len": s.output_len,
                "tp": s.tensor_parallel,
                "pp": s.pipeline_parallel,
                "n_gpus": s.n_gpus,
            }
            f.write(json.dumps(row) + "\n")


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
    subsets = _subsets(ms, pv)
    wall_s = time.perf_counter() - t0
    out = Path(__file__).parent / "results" / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "n_measurements": len(ms),
        "wall_s": round(wall_s, 2),
        "learned_vs_analytical_grouped_cv": cv.comparison,
        "learned_fallback": cv.fallback,
        "analytical_note": "time metrics out of source: efficiencies fitted leave-one-source-out",
        "analytical_subsets": subsets,
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
    _write_rows(ms, reports[0], out.parent / "eval_rows.jsonl")
    for label, d in subsets.items():
        figs = " ".join(
            f"{m}={d[m]['mape']:.1%}(n={d[m]['n']})"
            for m in ("step_time_s", "ttft_s", "tpot_s")
            if m in d
        )
        ratio = d["cross_gpu_ratio"]
        tail = (
            f" ratio median={ratio['median_error']:.1%} mean={ratio['mean_error']:.1%}"
            if ratio
            else ""
        )
        print(f"analytical [{label}] {figs}{tail}")
    print(f"wrote {out} in {wall_s:.1f} s")
    for r in reports:
        for m, s in r.overall.items():
            trusted = r.by_trust.get(m, {}).get("calibration")
            cov_t = (
                f" cov(calibration rows)={trusted.coverage:6.1%}"
                f" MAPE(calibration rows)={trusted.mape:6.1%}(n={trusted.n})"
                f" upper/measured-1(calibration rows)={trusted.headroom_vs_measured:6.1%}"
                if trusted
                else ""
            )
            print(
                f"{r.tier:10s} {m:14s} n={s.n:4d} MAPE={s.mape:6.1%} median={s.median_ape:6.1%} "
                f"cov={s.coverage:6.1%} headroom={s.mean_headroom:6.1%} "
                f"upper/measured-1={s.headroom_vs_measured:6.1%}{cov_t}"
            )


if __name__ == "__main__":
    main()
