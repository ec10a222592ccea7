"""The history tier: a job that recurs uses what it really used on its last runs.

This is Google Autopilot's recommender in miniature: the fingerprint of a job is its model, its
configuration and its command (everything that shapes memory and time, nothing that names or
schedules it), and its prediction on a GPU type is a high percentile of the peaks and runtimes
measured for that fingerprint there, over a window of the most recent runs. The bound adds a
fixed safety margin on top of the largest recent value.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .evaluation import EvalReport, PredictedValues, Unexpressed, evaluate
from .exceptions import NotFittedError
from .measurements import METRICS, Measurement
from .spec import JobSpec

__all__ = ["HistoryPredictor", "cross_validate_history", "fingerprint"]

_NOT_IDENTITY = ("id", "gpu", "priority", "deadline_s", "steps", "num_requests")


def fingerprint(spec: JobSpec) -> str:
    """Stable 16-hex id of (model, config, command): what makes two runs the same job.

    ``steps``/``num_requests`` are left out because they scale runtime, not per-step cost;
    the tier stores per-step times and the job's own length rescales them.
    """
    d = spec.to_dict()
    for k in _NOT_IDENTITY:
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class HistoryPredictor:
    """Per (fingerprint, GPU, metric): a high percentile of the last ``window`` measured runs."""

    percentile: float = 95.0
    window: int = 20
    min_runs: int = 1
    margin_fraction: float = 0.05
    _runs: dict[tuple[str, str, str], list[tuple[str, float]]] = field(
        default_factory=lambda: defaultdict(list), repr=False
    )

    def fit(self, measurements: Sequence[Measurement]) -> HistoryPredictor:
        """Index measured runs; simulated and OOM runs never count as a job's true usage."""
        self._runs = defaultdict(list)
        for m in measurements:
            if m.simulated or m.oom or m.gpu is None:
                continue
            fp = fingerprint(m.spec)
            for metric in METRICS:
                v = m.value(metric)
                if v is not None:
                    self._runs[(fp, m.gpu, metric)].append((m.date or "", float(v)))
        for runs in self._runs.values():
            runs.sort(key=lambda dv: dv[0])
        self.n_fingerprints_ = len({k[0] for k in self._runs})
        return self

    def lookup(self, spec: JobSpec, gpu: str, metric: str) -> tuple[float, float, int] | None:
        """(point, upper, n_runs) from recent runs of this job on ``gpu``; None if too few."""
        if not hasattr(self, "n_fingerprints_"):
            raise NotFittedError("HistoryPredictor is not fitted; call fit(measurements)")
        runs = self._runs.get((fingerprint(spec), gpu, metric))
        if not runs or len(runs) < self.min_runs:
            return None
        recent = np.array([v for _, v in runs[-self.window :]])
        point = float(np.percentile(recent, self.percentile))
        upper = float(recent.max()) * (1.0 + self.margin_fraction)
        return point, upper, int(recent.size)


def cross_validate_history(measurements: Sequence[Measurement], n_splits: int = 5) -> EvalReport:
    """Leave-one-run-out: each measured run is predicted from the *other* runs of its job.

    Rows whose job has no other run are not expressible by this tier and are listed.
    ``n_splits`` is accepted for a uniform CLI; history has no folds to choose.
    """
    del n_splits
    n = len(measurements)
    point = {m: np.full(n, np.nan) for m in METRICS}
    upper = {m: np.full(n, np.nan) for m in METRICS}
    unexpressed: list[Unexpressed] = []
    by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, m in enumerate(measurements):
        if m.gpu is not None:
            by_key[(fingerprint(m.spec), m.gpu)].append(i)
    for i, m in enumerate(measurements):
        others = [k for k in by_key.get((fingerprint(m.spec), m.gpu or ""), []) if k != i]
        for metric in METRICS:
            if m.value(metric) is None:
                continue
            if not others:
                unexpressed.append(Unexpressed(m.id, metric, "no other run of this job"))
                continue
            h = HistoryPredictor().fit([measurements[k] for k in others])
            got = h.lookup(m.spec, m.gpu or "", metric)
            if got is None:
                unexpressed.append(Unexpressed(m.id, metric, "other runs lack this metric"))
                continue
            point[metric][i], upper[metric][i], _ = got
    pv = PredictedValues(point, upper, tuple(m.gpu for m in measurements), tuple(unexpressed))
    report = evaluate(measurements, pv, tier="history")
    report.notes.append("leave-one-run-out over runs of the same fingerprint and GPU")
    return report
