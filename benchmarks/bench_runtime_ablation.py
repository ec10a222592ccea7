"""Ablation of the issue-14 runtime changes: each one reverted, out-of-source time metrics.

The three changes are the GEMM roofline p-norm (``gemm.roofline_p``; reverted: p = 1, the sum
of compute and weight-read time, not fitted), the quoted eager per-collective sync prior
(``comm.uncaptured_latency_s``; reverted: the earlier 2e-5 s guess) and the clock scaling of
latency-bound costs (``BOOST_CLOCK_MHZ``; reverted: every GPU at the A100's clock, i.e. no
scaling). For each combination the efficiency table is refitted leave-one-source-out exactly
as ``bench_eval.py`` does, and the calibration rows' MAPE, median bias and the cross-GPU ratio
error are reported (same figures as ``analytical_subsets`` in ``eval.json`` for the variant
with nothing reverted). Writes ``benchmarks/results/runtime_ablation.json``.

    SNUGFIT_HOME=... PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_runtime_ablation.py

About 1 minute per variant on the 2-core dev machine (8 variants).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from _common import write_result

import predictor._fit as fit
import predictor._runtime as runtime
import predictor.efficiency as efficiency
from predictor.evaluation import job_key, source_group
from predictor.gpus import GPU_NAMES
from predictor.measurements import calibration_exclusion, is_quirk, load_measurements

CHANGES = ("roofline_p", "uncaptured_prior", "clock_scaling")


@contextmanager
def _reverted(which: set[str]) -> Iterator[None]:
    """Patch the model constants back to their pre-issue-14 values for ``which``."""
    params, clocks = efficiency.PARAMETERS, dict(runtime.BOOST_CLOCK_MHZ)
    new = []
    for p in params:
        if "roofline_p" in which and p.name == "gemm.roofline_p":
            p = dataclasses.replace(p, prior=1.0, fitted=False)
        if "uncaptured_prior" in which and p.name == "comm.uncaptured_latency_s":
            p = dataclasses.replace(p, prior=2e-5)
        new.append(p)
    by_name = dict(efficiency._BY_NAME)
    try:
        efficiency.PARAMETERS = fit.PARAMETERS = tuple(new)
        efficiency._BY_NAME.clear()
        efficiency._BY_NAME.update({p.name: p for p in new})
        if "clock_scaling" in which:
            for k in runtime.BOOST_CLOCK_MHZ:
                runtime.BOOST_CLOCK_MHZ[k] = runtime.BOOST_CLOCK_MHZ["ampere"]
        yield
    finally:
        efficiency.PARAMETERS = fit.PARAMETERS = params
        efficiency._BY_NAME.clear()
        efficiency._BY_NAME.update(by_name)
        runtime.BOOST_CLOCK_MHZ.update(clocks)


def _out_of_source(ms: list[Any]) -> list[dict[str, Any]]:
    """Every calibration time row, predicted by a table fitted without its source."""
    pairs = [(source_group(m), m) for m in ms]
    timed = sorted({g for g, m in pairs if any(map(m.value, fit.TIME_METRICS))})
    out: list[dict[str, Any]] = []
    for held in timed:
        eff = fit.fit_efficiencies([m for g, m in pairs if g != held])
        test = [m for g, m in pairs if g == held]
        rows = fit._rows(test)
        if rows is None:
            continue
        pred = fit._predict(rows, eff)
        usable = [m for m in test if not is_quirk(m)]  # the rows _rows keeps, in its order
        for k in range(rows.job.size):
            m = usable[rows.job[k]]
            if calibration_exclusion(m) is None:
                out.append(
                    {
                        "gpu": m.gpu,
                        "metric": fit.TIME_METRICS[rows.metric[k]],
                        "key": job_key(m.spec),
                        "ratio": float(pred[k] / rows.measured[k]),
                    }
                )
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for metric in fit.TIME_METRICS:
        r = np.array([x["ratio"] for x in rows if x["metric"] == metric])
        if r.size:
            doc[metric] = {
                "n": int(r.size),
                "mape": round(float(np.mean(np.abs(r - 1.0))), 4),
                "median_bias": round(float(np.median(r) - 1.0), 4),
            }
    pairs: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for x in rows:
        pairs[(x["key"], x["metric"])].setdefault(x["gpu"], x["ratio"])
    errs = [
        abs(per[a] / per[b] - 1.0)  # (pred_a/pred_b)/(meas_a/meas_b) = ratio_a / ratio_b
        for per in pairs.values()
        for a, b in itertools.combinations(sorted(per, key=GPU_NAMES.index), 2)
    ]
    doc["cross_gpu_ratio"] = {
        "n_pairs": len(errs),
        "mean_error": round(float(np.mean(errs)), 4),
        "median_error": round(float(np.median(errs)), 4),
    }
    return doc


def main() -> None:
    t0 = time.perf_counter()
    ms = [m for m in load_measurements() if m.gpu is not None]
    variants: dict[str, Any] = {}
    for n in range(len(CHANGES) + 1):
        for which in itertools.combinations(CHANGES, n):
            label = "reverted: " + (", ".join(which) or "nothing (as shipped)")
            with _reverted(set(which)):
                variants[label] = _summary(_out_of_source(ms))
            print(label, variants[label], flush=True)
    write_result(
        "runtime_ablation.json",
        {
            "note": "calibration rows, leave-one-source-out refit per variant (as bench_eval.py)",
            "variants": variants,
            "wall_s": round(time.perf_counter() - t0, 1),
            "uptime_load": Path("/proc/loadavg").read_text().split()[0],
        },
    )


if __name__ == "__main__":
    main()
