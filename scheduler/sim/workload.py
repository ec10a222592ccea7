"""Seeded, realistic LLM workload: JobSpecs, arrival times and the GPU a user would request.

The mix lives in ``datasets/workloads/mix.yaml`` and is documented in the README beside it:
serving, batch inference, LoRA, QLoRA, full fine-tuning and pre-training; model popularity
skewed to 7-8B as on public hubs; heavy-tailed durations (lognormal ``steps`` and
``num_requests``); diurnal arrivals from a non-homogeneous Poisson process (thinning).

Most of a real cluster's submissions are re-runs (Google's Autopilot paper, EuroSys'20: the bulk
of jobs recur, which is what makes history-based limits work). So a ``recurrence.share`` of the
arrivals re-run one of ``recurrence.templates`` recurring jobs, picked with Zipf popularity, with
the same spec and the same requested GPU each time; the rest are one-off jobs. Every job carries a
``fingerprint``: the template's for a re-run, its own for a one-off. The simulator draws ground
truth per fingerprint, so re-runs of one job behave alike.
Same mix, days and seed → the same workload.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from predictor._paths import datasets_dir
from predictor.gpus import GPU_NAMES
from predictor.models import resolve_model
from predictor.prediction import PredictionTable
from predictor.spec import JobSpec, parse_spec
from scheduler.exceptions import SimulationError

__all__ = [
    "MIX_PATH",
    "JobClass",
    "Mix",
    "Recurrence",
    "Workload",
    "distinct_rows",
    "generate_workload",
    "load_mix",
    "predict_workload",
]

MIX_PATH = datasets_dir() / "workloads" / "mix.yaml"
SECONDS_PER_DAY = 86_400.0


class LogNormal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)


class JobClass(BaseModel):
    """One kind of job; list-valued fields are sampled uniformly."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(gt=0)
    task: str
    framework: str | None = None
    batch_size: list[int]
    input_len: list[int] | None = None
    output_len: list[int] | None = None
    seq_len: list[int] | None = None
    gradient_checkpointing: list[bool] | None = None
    lora_rank: list[int] | None = None
    num_requests: LogNormal | None = None
    steps: LogNormal | None = None
    max_params_b: float | None = None

    @model_validator(mode="after")
    def _duration(self) -> JobClass:
        if (self.num_requests is None) == (self.steps is None):
            raise ValueError(
                "each class needs exactly one duration: `num_requests` (inference) or "
                f"`steps` (training); got num_requests={self.num_requests}, steps={self.steps}"
            )
        return self


class Recurrence(BaseModel):
    """Which share of submissions re-run a recurring job, and how many recurring jobs exist."""

    model_config = ConfigDict(extra="forbid")
    share: float = Field(default=0.0, ge=0, le=1)
    templates: int = Field(default=1, ge=1)
    zipf_exponent: float = Field(default=1.0, ge=0)


class Mix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recurrence: Recurrence = Field(default_factory=Recurrence)
    jobs_per_day: float = Field(gt=0)
    diurnal_amplitude: float = Field(ge=0, lt=1)
    peak_hour: float = Field(ge=0, lt=24)
    requested_gpu_weights: dict[str, float]
    models: dict[str, float]
    classes: dict[str, JobClass]
    multi_gpu_params_b: float = Field(gt=0)
    multi_gpu_n_gpus: list[int]

    @model_validator(mode="after")
    def _names(self) -> Mix:
        bad = [g for g in self.requested_gpu_weights if g not in GPU_NAMES]
        if bad:
            raise ValueError(f"unknown GPU type(s) {bad}; use {', '.join(GPU_NAMES)}")
        return self


@lru_cache(maxsize=8)
def _load_mix_cached(path: str) -> Mix:
    p = Path(path)
    if not p.exists():
        raise SimulationError(f"workload mix {path!r} does not exist; default is {MIX_PATH}")
    try:
        return Mix.model_validate(yaml.safe_load(p.read_text()))
    except (ValidationError, yaml.YAMLError) as exc:
        raise SimulationError(f"{p.name}: invalid workload mix: {exc}") from None


def load_mix(path: str | Path = MIX_PATH) -> Mix:
    return _load_mix_cached(str(path))


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs sorted by arrival. ``requested_gpu`` is the whole GPU type a user would ask for;
    ``fingerprint`` names the recurring job a submission re-runs (``tpl-<k>``) or, for a
    one-off, the submission itself (``once-<i>``)."""

    specs: tuple[JobSpec, ...]
    arrival_s: np.ndarray
    requested_gpu: tuple[str, ...]
    job_class: tuple[str, ...]
    fingerprint: tuple[str, ...] = ()

    @property
    def recurring(self) -> np.ndarray:
        """Per job: whether it re-runs a recurring template."""
        return np.fromiter((f.startswith("tpl-") for f in self.fingerprint), bool, len(self))

    def __len__(self) -> int:
        return len(self.specs)


def _weights(d: dict[str, float]) -> tuple[list[str], np.ndarray]:
    names = list(d)
    w = np.asarray([d[n] for n in names], float)
    return names, w / w.sum()


def _arrivals(mix: Mix, days: float, rng: np.random.Generator) -> np.ndarray:
    """Thinning (Lewis & Shedler) for rate(t) = mean·(1 + A·cos(2π(hour − peak)/24))."""
    horizon = days * SECONDS_PER_DAY
    mean_rate = mix.jobs_per_day / SECONDS_PER_DAY
    peak_rate = mean_rate * (1 + mix.diurnal_amplitude)
    n = rng.poisson(peak_rate * horizon)
    t = np.sort(rng.uniform(0.0, horizon, n))
    hour = (t / 3600.0) % 24.0
    rate = mean_rate * (
        1 + mix.diurnal_amplitude * np.cos(2 * math.pi * (hour - mix.peak_hour) / 24)
    )
    return t[rng.random(n) < rate / peak_rate]


@lru_cache(maxsize=256)
def _params_b(model: str) -> float:
    arch = resolve_model(model)
    return float(arch.params_b) if arch.params_b is not None else arch.total_params() / 1e9


def _lognormal_int(d: LogNormal, rng: np.random.Generator) -> int:
    # Clip at 50x the median: a week-long simulation should not hold one job for a year.
    x = d.median * math.exp(d.sigma * rng.standard_normal())
    return int(max(1, min(round(x), 50 * d.median)))


def _spec_dict(
    name: str, cls: JobClass, model: str, mix: Mix, rng: np.random.Generator, job_id: str
) -> dict[str, Any]:
    def pick(values: list[Any] | None) -> Any:
        return None if values is None else values[int(rng.integers(len(values)))]

    params = _params_b(model)
    d: dict[str, Any] = {"id": job_id, "model": model, "task": cls.task}
    if cls.framework is not None:
        d["framework"] = cls.framework
    d["batch_size"] = pick(cls.batch_size)
    for key in ("input_len", "output_len", "seq_len", "gradient_checkpointing", "lora_rank"):
        v = pick(getattr(cls, key))
        if v is not None:
            d[key] = v
    if cls.num_requests is not None:
        d["num_requests"] = _lognormal_int(cls.num_requests, rng)
    if cls.steps is not None:
        d["steps"] = _lognormal_int(cls.steps, rng)
    n_gpus = 1
    if cls.task == "inference" and params > mix.multi_gpu_params_b:
        n_gpus = int(pick(mix.multi_gpu_n_gpus))
        d["tensor_parallel"] = n_gpus
    elif cls.task in ("full_finetune", "pretrain", "lora") and (
        params > (cls.max_params_b or mix.multi_gpu_params_b)
    ):
        n_gpus = int(pick(mix.multi_gpu_n_gpus))
        d["zero_stage"] = 3
    d["n_gpus"] = n_gpus
    return d


def _cdf(w: np.ndarray) -> np.ndarray:
    """The cumulative sum ``Generator.choice`` searches for probabilities ``w``."""
    cdf = np.asarray(w, np.float64).cumsum()
    cdf /= cdf[-1]
    return cdf


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=float) ** exponent
    return w / w.sum()


class _Drawer:
    """Draws one job (class, model, requested GPU, spec) from the mix."""

    def __init__(self, mix: Mix, rng: np.random.Generator) -> None:
        self.mix = mix
        self.rng = rng
        self.class_names, self.class_w = _weights({k: c.weight for k, c in mix.classes.items()})
        self.model_names, self.model_w = _weights(mix.models)
        self.gpu_names, self.gpu_w = _weights(mix.requested_gpu_weights)
        self._cdfs = [_cdf(w) for w in (self.class_w, self.model_w, self.gpu_w)]

    def _pick(self, which: int) -> int:
        """``rng.choice(n, p=w)`` without re-validating ``w`` each draw: numpy's own inversion
        (one uniform, searched in the normalised cumulative sum), so the same stream and the
        same picks (a test holds the two equal)."""
        return int(self._cdfs[which].searchsorted(self.rng.random(), side="right"))

    def draw(self, job_id: str) -> tuple[JobSpec, str, str]:
        rng, m = self.rng, self.mix
        name = self.class_names[self._pick(0)]
        model = self.model_names[self._pick(1)]
        gpu = self.gpu_names[self._pick(2)]
        cls = m.classes[name]
        # Pre-training from scratch is done on small models here; redraw among those.
        if cls.task == "pretrain" and cls.max_params_b is not None:
            small = [k for k in self.model_names if _params_b(k) <= cls.max_params_b]
            if small:
                model = small[int(rng.integers(len(small)))]
        spec = parse_spec(_spec_dict(name, cls, model, m, rng, job_id))
        return spec, gpu, name


def generate_workload(
    days: float = 7.0,
    seed: int = 0,
    *,
    mix: Mix | str | Path = MIX_PATH,
    jobs_per_day: float | None = None,
    max_jobs: int | None = None,
    recurrence_share: float | None = None,
) -> Workload:
    """Draw a workload: arrivals over ``days``, then one job per arrival (see module doc).

    ``recurrence_share`` overrides the mix's share of re-runs (0: every job is a one-off).
    """
    if days <= 0:
        raise SimulationError(f"`days` must be positive; got {days}")
    m = mix if isinstance(mix, Mix) else load_mix(mix)
    if jobs_per_day is not None:
        m = m.model_copy(update={"jobs_per_day": float(jobs_per_day)})
    rec = m.recurrence
    if recurrence_share is not None:
        if not 0 <= recurrence_share <= 1:
            raise SimulationError(f"recurrence_share must be in [0, 1]; got {recurrence_share}")
        rec = rec.model_copy(update={"share": float(recurrence_share)})
    # Separate streams: the arrivals, the recurring templates and the one-off jobs do not shift
    # each other when one of them changes.
    rng_arr, rng_tpl, rng_job = (np.random.default_rng([seed, k]) for k in range(3))
    arrivals = _arrivals(m, days, rng_arr)
    if max_jobs is not None:
        arrivals = arrivals[:max_jobs]
    n = arrivals.size
    is_rerun = rng_arr.random(n) < rec.share
    which = rng_arr.choice(rec.templates, size=n, p=_zipf_weights(rec.templates, rec.zipf_exponent))
    templates: dict[int, tuple[JobSpec, str, str]] = {}
    tpl_drawer = _Drawer(m, rng_tpl)
    job_drawer = _Drawer(m, rng_job)
    specs: list[JobSpec] = []
    gpus: list[str] = []
    classes: list[str] = []
    fps: list[str] = []
    for i in range(n):
        job_id = f"job-{seed}-{i:07d}"
        if is_rerun[i]:
            k = int(which[i])
            # Templates are drawn in order of first use, so a longer horizon extends, not
            # reshuffles, a shorter one.
            if k not in templates:
                templates[k] = tpl_drawer.draw(f"tpl-{seed}-{k}")
            tspec, gpu, name = templates[k]
            spec = tspec.model_copy(update={"id": job_id})
            fp = f"tpl-{k}"
        else:
            spec, gpu, name = job_drawer.draw(job_id)
            fp = f"once-{i}"
        specs.append(spec)
        gpus.append(gpu)
        classes.append(name)
        fps.append(fp)
    return Workload(
        specs=tuple(specs),
        arrival_s=arrivals,
        requested_gpu=tuple(gpus),
        job_class=tuple(classes),
        fingerprint=tuple(fps),
    )


def distinct_rows(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: the index of each distinct spec's first submission, and for every
    job the position of its spec in ``first``. A recurring job's submissions share a label and
    differ only in ``id``; a label is only a hint (a spec whose other fields differ from its
    label's first one is a spec of its own). Without labels every job is its own row."""
    global _last_rows
    if _last_rows is not None and _last_rows[0] is workload:
        return _last_rows[1]
    out = _distinct_rows(workload)
    for a in out:
        a.flags.writeable = False
    _last_rows = (workload, out)
    return out


#: The last workload asked about and its answer (the workload is frozen; holding it keeps its
#: identity from being reused): predicting it and setting up its simulation both ask.
_last_rows: tuple[Workload, tuple[np.ndarray, np.ndarray]] | None = None


def _distinct_rows(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    n = len(workload)
    labels = workload.fingerprint if len(workload.fingerprint) == n else ()
    if not labels:
        return np.arange(n), np.arange(n)
    repeated = {k for k, c in Counter(labels).items() if c > 1}
    seen: dict[str, tuple[dict[str, Any], int]] = {}
    first: list[int] = []
    inverse = np.empty(n, np.int64)
    for i, spec in enumerate(workload.specs):
        label = labels[i]
        if label in repeated:
            fields = {**spec.__dict__, "id": None}
            got = seen.get(label)
            if got is not None and got[0] == fields:
                inverse[i] = got[1]
                continue
            seen.setdefault(label, (fields, len(first)))
        inverse[i] = len(first)
        first.append(i)
    return np.asarray(first, np.int64), inverse


def predict_workload(
    workload: Workload, predict: Callable[[list[JobSpec]], PredictionTable] | None = None
) -> PredictionTable:
    """``predict`` (the analytical table by default) of every job, each distinct spec
    predicted once (:func:`distinct_rows`): the same rows as predicting every spec."""
    if predict is None:
        from predictor.analytical import predict_table

        predict = predict_table
    first, inverse = distinct_rows(workload)
    if len(first) == len(workload):
        return predict(list(workload.specs))
    table = predict([workload.specs[i] for i in first.tolist()])
    return table.take(inverse, tuple(s.id for s in workload.specs))
