"""The history tier: a job that recurs uses what it really used on its last runs.

This is Google Autopilot's recommender in miniature: the fingerprint of a job is its model, its
configuration and its command (everything that shapes memory and time, nothing that names or
schedules it), and its prediction on a GPU type is a high percentile of the peaks and runtimes
measured for that fingerprint there, over a window of the most recent runs. The bound adds a
fixed safety margin on top of the largest recent value.

The live scheduler and the simulator use it through ratios to the predictor's own figures
(:meth:`HistoryPredictor.observe`, :meth:`HistoryPredictor.factors`): a ratio measured on one
GPU type carries to the others through the predictor's cross-type ratio (its figure there over
its figure on the measured type), with a wider bound until that type has been measured. An OOM
is censored: the job died at its limit, so the peak was at least that; it becomes a floor
``CENSORED_FLOOR_MARGIN`` above the limit, never a peak.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .evaluation import EvalReport, PredictedValues, Unexpressed, evaluate
from .exceptions import NotFittedError
from .measurements import METRICS, Measurement
from .spec import JobSpec

__all__ = [
    "CENSORED_FLOOR_MARGIN",
    "CROSS_TYPE_MARGIN",
    "HistoryFactors",
    "HistoryPredictor",
    "cross_validate_history",
    "fingerprint",
    "fingerprint_dict",
]

# ``max_tensor_parallel`` only permits an OOM retry at another degree; a run at a given degree
# is the same job with or without it. Who ran a job and what it waited for do not change what
# it uses either: with ``user`` in the fingerprint, every job the client stamps with the OS user
# drew another simulated truth than the simulator's copy of it (the demo's live column fell
# 16% below the simulated one) and one user's history never answered another's run.
_NOT_IDENTITY = (
    "id",
    "gpu",
    "priority",
    "deadline_s",
    "steps",
    "num_requests",
    "max_tensor_parallel",
    "user",
    "team",
    "depends_on",
    # Where it may run, not what it is: the same job on any node uses the same memory.
    "node_selector",
)
#: An OOM'd run's peak was at least its limit; the next reservation is this much above it.
CENSORED_FLOOR_MARGIN = 0.10
#: Extra bound on a GPU type this job has not been measured on (the cross-type ratio's error).
CROSS_TYPE_MARGIN = 0.10


def fingerprint(spec: JobSpec) -> str:
    """Stable 16-hex id of (model, config, command): what makes two runs the same job.

    ``steps``/``num_requests`` are left out because they scale runtime, not per-step cost;
    the tier stores per-step times and the job's own length rescales them.
    """
    return fingerprint_dict(spec.to_dict())


def fingerprint_dict(spec: dict[str, object]) -> str:
    """:func:`fingerprint` of a spec already in its ``to_dict()`` form (a stored record's)."""
    d = {k: v for k, v in spec.items() if k not in _NOT_IDENTITY}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile without numpy's per-call overhead on short lists."""
    xs = sorted(values)
    pos = q / 100.0 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class HistoryFactors:
    """One fingerprint's history as ratios to the predictor's figures, per GPU type.

    ``n_runs`` counts finished runs (0: only OOM floors are known). VRAM and runtime arrays are
    NaN where nothing is known; ``vram_floor`` is the censored floor (NaN without an OOM).
    """

    n_runs: int
    vram_point: np.ndarray
    vram_upper: np.ndarray
    runtime_point: np.ndarray
    runtime_upper: np.ndarray
    vram_floor: np.ndarray
    measured: np.ndarray  # bool: this type has a finished run of its own


@dataclass
class HistoryPredictor:
    """Per (fingerprint, GPU, metric): a high percentile of the last ``window`` measured runs."""

    percentile: float = 95.0
    window: int = 20
    min_runs: int = 1
    margin_fraction: float = 0.05
    # The ratio form (observe/factors): a wider VRAM margin while few runs are known, and the
    # runtime's (whose point is the median).
    margin_per_run: float = 0.10
    runtime_margin: float = 0.10
    _runs: dict[tuple[str, str, str], list[tuple[str, float]]] = field(
        default_factory=lambda: defaultdict(list), repr=False
    )
    _ratios: dict[str, dict[str, tuple[list[float], list[float], list[float]]]] = field(
        default_factory=dict, repr=False
    )
    # factors() per fingerprint and GPU list until the fingerprint's next observation (a
    # recurring job is asked for at every submission, and most submissions add nothing new).
    _factors: dict[str, tuple[tuple[str, ...], HistoryFactors]] = field(
        default_factory=dict, repr=False
    )

    def observe(
        self,
        fp: str,
        gpu: str,
        vram_ratio: float | None,
        runtime_ratio: float | None = None,
        *,
        censored: bool = False,
    ) -> None:
        """Add one run of ``fp`` on ``gpu``: measured / predicted peak and runtime. ``censored``
        (an OOM): ``vram_ratio`` is the limit it died at over the predicted peak, a floor."""
        self._factors.pop(fp, None)
        vram, runtime, floors = self._ratios.setdefault(fp, {}).setdefault(gpu, ([], [], []))
        if vram_ratio is not None and vram_ratio > 0:
            (floors if censored else vram).append(float(vram_ratio))
        if runtime_ratio is not None and runtime_ratio > 0 and not censored:
            runtime.append(float(runtime_ratio))

    def factors(self, fp: str, gpus: Sequence[str]) -> HistoryFactors | None:
        """Ratios to apply to the predictor's figures on ``gpus``; None if ``fp`` is unknown.
        The arrays are shared between calls until ``fp``'s next observation: do not write them."""
        per = self._ratios.get(fp)
        if not per:
            return None
        names = tuple(gpus)
        got = self._factors.get(fp)
        if got is not None and got[0] == names:
            return got[1]
        f = self._factors_of(per, len(names), names)
        self._factors[fp] = (names, f)
        return f

    def _factors_of(
        self,
        per: dict[str, tuple[list[float], list[float], list[float]]],
        n: int,
        gpus: Sequence[str],
    ) -> HistoryFactors:
        w = self.window
        wins = [(v[-w:], r[-w:], f[-w:]) for v, r, f in per.values()]
        if len(wins) == 1:  # one type's runs: they are every type's runs
            every_v, every_r, floors = wins[0]
        else:
            every_v = [x for v, _, _ in wins for x in v]
            every_r = [x for _, r, _ in wins for x in r]
            floors = [x for _, _, f in wins for x in f]
        out = {k: np.full(n, np.nan) for k in ("vp", "vu", "rp", "ru")}
        measured = np.zeros(n, bool)
        # A type with no run of its own reads every type's runs: the same figures for each
        # such type, computed once.
        cross: dict[str, tuple[float, float]] = {}
        for j, g in enumerate(gpus):
            own_v, own_r, _ = per.get(g, ([], [], []))
            measured[j] = bool(own_v)
            if own_v:
                vs = own_v[-w:]
                out["vp"][j], out["vu"][j] = self._vram(vs, 0.0)
            elif every_v:
                if "v" not in cross:
                    cross["v"] = self._vram(every_v, CROSS_TYPE_MARGIN)
                out["vp"][j], out["vu"][j] = cross["v"]
            if own_r:
                out["rp"][j], out["ru"][j] = self._runtime(own_r[-w:], 0.0)
            elif every_r:
                if "r" not in cross:
                    cross["r"] = self._runtime(every_r, CROSS_TYPE_MARGIN)
                out["rp"][j], out["ru"][j] = cross["r"]
        floor = max(floors) * (1.0 + CENSORED_FLOOR_MARGIN) if floors else math.nan
        n_runs = max((len(v) for v, _, _ in wins), default=0)
        return HistoryFactors(
            n_runs, out["vp"], out["vu"], out["rp"], out["ru"], np.full(n, floor), measured
        )

    def _vram(self, vs: list[float], extra: float) -> tuple[float, float]:
        """(point, upper) VRAM ratio from the runs ``vs``."""
        grow = 1.0 + self.margin_fraction + self.margin_per_run / len(vs) + extra
        return _percentile(vs, self.percentile), max(vs) * grow

    def _runtime(self, rs: list[float], extra: float) -> tuple[float, float]:
        """(point, upper) runtime ratio from the runs ``rs``."""
        return _percentile(rs, 50.0), max(rs) * (1.0 + self.runtime_margin + extra)

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
