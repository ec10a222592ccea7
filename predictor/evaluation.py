"""Accuracy report: predictions against measured runs, like with like.

A measured peak only means something next to the prediction of the *same quantity*:

* ``allocated`` (torch ``max_memory_allocated``) counts tensors only → compared with
  ``peak − overhead`` (overhead = CUDA context + NCCL + allocator slack, memory no tensor holds);
* ``reserved`` adds the caching allocator's slack → compared with ``peak − CUDA context −
  NCCL buffers`` (NCCL's buffers are cudaMalloc'd outside the caching allocator);
* ``nvml_used`` (nvidia-smi) is everything on the device → compared with the full ``peak``,
  with the source's own measured CUDA context in place of the catalogue GPU's where the row
  states it (``hardware.cuda_context_gib``: V100/CUDA 11 contexts are 1.3 GiB);
* ``unknown`` (a log that does not say which torch stat) is treated as ``reserved``, the middle
  of the three, and reported as its own group so it can be excluded.

Runtime metrics compare ``step_time_s`` / ``ttft_s`` / ``tpot_s`` / ``runtime_s`` directly. Upper
bounds for the time metrics scale with the table's ``runtime_upper_s / runtime_s``.

Everything here is pure: it takes measurements and predictions and returns dataclasses; the
tables and JSON live in ``scheduler/cli/eval.py``. Only measured data is ever scored.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from ._memory import MemoryModel
from .gpus import GPU_NAMES
from .measurements import METRICS, Measurement, calibration_exclusion
from .prediction import PredictionTable
from .spec import JobSpec

__all__ = [
    "PROXY_GPU",
    "EvalReport",
    "PredictedValues",
    "RatioError",
    "RowError",
    "Summary",
    "TablePredictor",
    "Unexpressed",
    "evaluate",
    "job_key",
    "predicted_values",
    "source_group",
    "summarise",
]

#: GPU column used for VRAM rows measured on a non-catalogue GPU (A10G, V100, RTX 4090...):
#: memory barely depends on the GPU, only the CUDA context does.
PROXY_GPU = "A100-80GB"

_TIME_FIELD = {
    "step_time_s": "step_time_s",
    "ttft_s": "ttft_s",
    "tpot_s": "tpot_s",
    "runtime_s": "runtime_s",
}


class TablePredictor(Protocol):
    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable: ...


@dataclass(frozen=True, slots=True)
class Unexpressed:
    id: str
    metric: str
    reason: str


@dataclass(frozen=True, slots=True)
class PredictedValues:
    """Predictions aligned with a list of measurements: ``point[metric][i]`` (NaN = none).

    ``point`` is already adjusted to the measurement's kind (see module docstring), so it can
    be compared with the measured value directly. ``analytical`` keeps the analytical tier's
    adjusted point, which the learned tier uses as its baseline.
    """

    point: dict[str, np.ndarray]
    upper: dict[str, np.ndarray]
    gpu_column: tuple[str | None, ...]
    unexpressed: tuple[Unexpressed, ...] = ()


@dataclass(frozen=True, slots=True)
class RowError:
    id: str
    source: str
    task: str
    gpu: str
    metric: str
    kind: str
    measured: float
    predicted: float
    upper: float
    confidence: str
    # False for low-confidence and documented-quirk rows, which never calibrate a bound.
    calibratable: bool = True

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    mape: float
    median_ape: float
    within_10pct: float
    coverage: float
    mean_headroom: float  # mean of upper / predicted − 1: the margin the bound adds
    bias: float  # median of predicted / measured − 1: positive = over-predicts
    #: mean of upper / measured − 1: what a reservation at the bound wastes (issue 13's metric)
    headroom_vs_measured: float = float("nan")

    def to_dict(self) -> dict[str, float]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class RatioError:
    """Speed ratio of the same job on two GPUs: measured vs predicted."""

    job: str
    metric: str
    gpu_a: str
    gpu_b: str
    measured_ratio: float
    predicted_ratio: float

    @property
    def error(self) -> float:
        return abs(self.predicted_ratio / self.measured_ratio - 1.0)


@dataclass(frozen=True)
class EvalReport:
    tier: str
    rows: list[RowError]
    overall: dict[str, Summary]
    by_task: dict[str, dict[str, Summary]]
    by_gpu: dict[str, dict[str, Summary]]
    by_source: dict[str, dict[str, Summary]]
    by_kind: dict[str, Summary]
    ratios: list[RatioError]
    ratio_summary: dict[str, float]
    unexpressed: list[Unexpressed]
    notes: list[str] = field(default_factory=list)
    by_trust: dict[str, dict[str, Summary]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def group(g: Mapping[str, Mapping[str, Summary]]) -> dict[str, Any]:
            return {m: {k: s.to_dict() for k, s in d.items()} for m, d in g.items()}

        return {
            "tier": self.tier,
            "overall": {m: s.to_dict() for m, s in self.overall.items()},
            "by_task": group(self.by_task),
            "by_gpu": group(self.by_gpu),
            "by_source": group(self.by_source),
            "by_trust": group(self.by_trust),
            "vram_by_measurement_kind": {k: s.to_dict() for k, s in self.by_kind.items()},
            "cross_gpu_ratio": self.ratio_summary,
            "ratios": [{**asdict(r), "error": round(r.error, 4)} for r in self.ratios],
            "unexpressed": [asdict(u) for u in self.unexpressed],
            "notes": self.notes,
        }


def source_group(m: Measurement) -> str:
    """The source a row came from, without the commit/URL detail (the CV group key)."""
    return m.source.split(" | ", 1)[0].strip() or m.source


def job_key(spec: JobSpec) -> str:
    """Identity of a job regardless of where it ran (spec without id/gpu/command/priority)."""
    d = spec.to_dict()
    for k in ("id", "gpu", "command", "priority", "deadline_s"):
        d.pop(k, None)
    return json.dumps(d, sort_keys=True)


def _column_for(m: Measurement, metric: str) -> str | None:
    if m.gpu is not None:
        return m.gpu
    return PROXY_GPU if metric == "peak_vram_gib" else None


def predicted_values(
    measurements: Sequence[Measurement],
    predictor: TablePredictor | Callable[..., PredictionTable],
    memory_model: MemoryModel | None = None,
) -> PredictedValues:
    """Predict every measurement on its own GPU and adjust VRAM to the measured kind."""
    mm = memory_model or MemoryModel()
    n = len(measurements)
    point = {m: np.full(n, np.nan) for m in METRICS}
    upper = {m: np.full(n, np.nan) for m in METRICS}
    cols: list[str | None] = []
    unexpressed: list[Unexpressed] = []
    if n == 0:
        return PredictedValues(point, upper, ())
    fn = predictor.predict_table if hasattr(predictor, "predict_table") else predictor
    table: PredictionTable = fn([m.spec for m in measurements], GPU_NAMES)
    rt_factor = table.runtime_upper_s / np.where(table.runtime_s > 0, table.runtime_s, np.nan)
    for i, m in enumerate(measurements):
        col0 = m.gpu or PROXY_GPU
        cols.append(col0)
        for metric in METRICS:
            if m.value(metric) is None:
                continue
            col = _column_for(m, metric)
            if col is None:
                unexpressed.append(
                    Unexpressed(m.id, metric, f"measured on {m.gpu_model!r}, not a catalogue GPU")
                )
                continue
            j = table.column(col)
            if metric == "peak_vram_gib":
                peak = float(table.peak_vram_gib[i, j])
                up = float(table.peak_vram_upper_gib[i, j])
                adj = _kind_adjustment(m, mm, col, float(table.breakdown_gib["overhead"][i, j]))
                point[metric][i] = peak - adj
                upper[metric][i] = up - adj
                continue
            v = float(getattr(table, _TIME_FIELD[metric])[i, j])
            if not np.isfinite(v) or v <= 0:
                unexpressed.append(
                    Unexpressed(m.id, metric, f"predictor gives no {metric} for this job")
                )
                continue
            point[metric][i] = v
            f = float(rt_factor[i, j])
            upper[metric][i] = v * (f if np.isfinite(f) else 1.0)
    return PredictedValues(point, upper, tuple(cols), tuple(unexpressed))


def _kind_adjustment(m: Measurement, mm: MemoryModel, gpu: str, overhead: float) -> float:
    """What to take off the predicted peak so it counts what ``m.measurement`` counts."""
    if m.measurement == "allocated":
        return overhead
    nccl = mm.nccl_buffers_gib if m.spec.n_gpus > 1 else 0.0
    if m.measurement in ("reserved", "unknown"):
        # torch's reserved figure holds neither the CUDA context nor NCCL's own buffers
        # (NCCL allocates them with cudaMalloc, outside the caching allocator).
        return mm.context_gib(gpu) + nccl
    stated = m.hardware.get("cuda_context_gib")
    if stated is not None:
        # nvidia-smi on the source's own GPU: its context as the source measured it, in place
        # of the catalogue GPU's.
        return mm.context_gib(gpu) - float(stated)
    return 0.0


def summarise(measured: np.ndarray, predicted: np.ndarray, upper: np.ndarray) -> Summary:
    """MAPE, median APE, share within 10%, upper-bound coverage and mean headroom."""
    measured = np.asarray(measured, dtype=float)
    predicted = np.asarray(predicted, dtype=float)
    upper = np.asarray(upper, dtype=float)
    if measured.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    ape = np.abs(predicted - measured) / measured
    ratio = predicted / measured
    headroom = upper / np.where(predicted > 0, predicted, np.nan) - 1.0
    return Summary(
        n=int(measured.size),
        mape=float(np.mean(ape)),
        median_ape=float(np.median(ape)),
        within_10pct=float(np.mean(ape <= 0.10)),
        coverage=float(np.mean(upper >= measured)),
        mean_headroom=float(np.nanmean(headroom)) if np.isfinite(headroom).any() else 0.0,
        bias=float(np.median(ratio) - 1.0),
        headroom_vs_measured=float(np.mean(upper / measured - 1.0)),
    )


def _grouped(
    rows: Iterable[RowError], key: Callable[[RowError], str]
) -> dict[str, dict[str, Summary]]:
    buckets: dict[str, dict[str, list[RowError]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        buckets[r.metric][key(r)].append(r)
    out: dict[str, dict[str, Summary]] = {}
    for metric in METRICS:
        if metric not in buckets:
            continue
        out[metric] = {
            k: _summ(v) for k, v in sorted(buckets[metric].items(), key=lambda kv: kv[0])
        }
    return out


def _summ(rows: Sequence[RowError]) -> Summary:
    return summarise(
        np.array([r.measured for r in rows]),
        np.array([r.predicted for r in rows]),
        np.array([r.upper for r in rows]),
    )


def _job_label(spec: JobSpec, key: str) -> str:
    import hashlib

    digest = hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"{spec.model_name}/{spec.task.value}/{digest}"


def _ratios(measurements: Sequence[Measurement], rows: Sequence[RowError]) -> list[RatioError]:
    by_id = {m.id: m for m in measurements}
    groups: dict[tuple[str, str], dict[str, RowError]] = defaultdict(dict)
    for r in rows:
        if r.metric == "peak_vram_gib" or by_id[r.id].gpu is None:
            continue
        key = (job_key(by_id[r.id].spec), r.metric)
        groups[key].setdefault(r.gpu, r)
    out: list[RatioError] = []
    for (job, metric), per_gpu in groups.items():
        gpus = sorted(per_gpu, key=GPU_NAMES.index)
        for a, b in itertools.combinations(gpus, 2):
            ra, rb = per_gpu[a], per_gpu[b]
            out.append(
                RatioError(
                    job=_job_label(by_id[ra.id].spec, job),
                    metric=metric,
                    gpu_a=a,
                    gpu_b=b,
                    measured_ratio=ra.measured / rb.measured,
                    predicted_ratio=ra.predicted / rb.predicted,
                )
            )
    return out


def evaluate(
    measurements: Sequence[Measurement],
    predictions: PredictedValues | TablePredictor | Callable[..., PredictionTable],
    tier: str = "analytical",
    extra_unexpressed: Iterable[Unexpressed] = (),
) -> EvalReport:
    """Score predictions against measurements; group by task, GPU, source and VRAM kind."""
    pv = (
        predictions
        if isinstance(predictions, PredictedValues)
        else predicted_values(measurements, predictions)
    )
    rows: list[RowError] = []
    for i, m in enumerate(measurements):
        for metric in METRICS:
            measured = m.value(metric)
            p = pv.point[metric][i] if len(pv.point[metric]) else np.nan
            if measured is None or not np.isfinite(p):
                continue
            u = pv.upper[metric][i]
            rows.append(
                RowError(
                    id=m.id,
                    source=source_group(m),
                    task=m.spec.task.value,
                    gpu=m.gpu or f"other:{m.gpu_model}",
                    metric=metric,
                    kind=m.measurement if metric == "peak_vram_gib" else "time",
                    measured=float(measured),
                    predicted=float(p),
                    upper=float(u) if np.isfinite(u) else float(p),
                    confidence=m.confidence,
                    calibratable=calibration_exclusion(m) is None,
                )
            )
    overall = {
        metric: _summ([r for r in rows if r.metric == metric])
        for metric in METRICS
        if any(r.metric == metric for r in rows)
    }
    ratios = _ratios(measurements, rows)
    ratio_summary: dict[str, float] = {}
    if ratios:
        errs = np.array([r.error for r in ratios])
        ratio_summary = {
            "n_pairs": float(len(ratios)),
            "mean_error": float(errs.mean()),
            "median_error": float(np.median(errs)),
            "within_10pct": float(np.mean(errs <= 0.10)),
        }
    vram = [r for r in rows if r.metric == "peak_vram_gib"]
    by_kind_rows: dict[str, list[RowError]] = defaultdict(list)
    for r in vram:
        by_kind_rows[r.kind].append(r)
    return EvalReport(
        tier=tier,
        rows=rows,
        overall=overall,
        by_task=_grouped(rows, lambda r: r.task),
        by_gpu=_grouped(rows, lambda r: r.gpu if not r.gpu.startswith("other:") else "other"),
        by_source=_grouped(rows, lambda r: r.source),
        by_kind={k: _summ(v) for k, v in sorted(by_kind_rows.items())},
        by_trust=_grouped(rows, lambda r: "calibration" if r.calibratable else "excluded"),
        ratios=ratios,
        ratio_summary=ratio_summary,
        unexpressed=[*extra_unexpressed, *pv.unexpressed],
        notes=[
            f"VRAM rows measured on non-catalogue GPUs use the {PROXY_GPU} column",
            "allocated vs peak − overhead; reserved/unknown vs peak − CUDA context − NCCL; "
            "nvml_used vs full peak (the source's stated CUDA context where given)",
            "by_trust: 'calibration' rows may calibrate bounds; 'excluded' are low-confidence "
            "or documented-quirk rows (scored everywhere, never used to calibrate)",
        ],
    )
