"""The Prediction contract (one per job per GPU type) and its array form for the scheduler."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .gpus import GPU_NAMES

__all__ = ["BREAKDOWN_KEYS", "Prediction", "PredictionTable", "TableFn", "contract_rows"]

BREAKDOWN_KEYS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "kv_cache",
    "logits",
    "overhead",
)


class Prediction(BaseModel):
    """Per-GPU peak VRAM (GiB) and runtime for one job on one GPU type. See DESIGN.md."""

    model_config = ConfigDict(extra="forbid")

    id: str | None
    gpu: str
    fits: bool
    peak_vram_gib: float = Field(ge=0)
    peak_vram_upper_gib: float = Field(ge=0)
    breakdown_gib: dict[str, float]
    runtime_s: float = Field(ge=0)
    runtime_upper_s: float = Field(ge=0)
    step_time_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    method: str

    @field_validator("breakdown_gib")
    @classmethod
    def _has_overhead(cls, v: dict[str, float]) -> dict[str, float]:
        if "overhead" not in v:
            raise ValueError("breakdown_gib must contain an `overhead` key")
        return v


@dataclass(frozen=True, slots=True)
class PredictionTable:
    """Predictions for many jobs on every GPU type, as ``(n_jobs, n_gpu_types)`` arrays.

    This is what the scheduler consumes: it never needs the per-component breakdown, and
    arrays keep placement vectorised. VRAM is per GPU in GiB; runtimes in seconds for the
    job's own GPU count.
    """

    job_ids: tuple[str | None, ...]
    gpu_names: tuple[str, ...]
    peak_vram_gib: np.ndarray
    peak_vram_upper_gib: np.ndarray
    runtime_s: np.ndarray
    runtime_upper_s: np.ndarray
    breakdown_gib: dict[str, np.ndarray]
    step_time_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    fits: np.ndarray
    method: tuple[str, ...]
    # Share of the runtime the GPU's bottleneck resource is saturated (0..1); what stretches on
    # a smaller MIG slice. None = unknown (treated as 1: fully saturating).
    busy_frac: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.job_ids)

    def column(self, gpu: str) -> int:
        return self.gpu_names.index(gpu)

    def row_arrays(self) -> list[np.ndarray]:
        """Every per-job array (row ``i`` is job ``i``), the breakdown's components included:
        what two jobs must share, with ``method``, to have the same predictions."""
        out: list[np.ndarray] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                out.append(v)
            elif isinstance(v, dict):
                out += v.values()
        return out

    def take(self, rows: np.ndarray, job_ids: tuple[str | None, ...]) -> PredictionTable:
        """The table's rows ``rows`` (repeats allowed), one per entry of ``job_ids``: the
        predictions of jobs that differ from an already predicted one only in their id."""
        return PredictionTable(
            job_ids=job_ids,
            gpu_names=self.gpu_names,
            peak_vram_gib=self.peak_vram_gib[rows],
            peak_vram_upper_gib=self.peak_vram_upper_gib[rows],
            runtime_s=self.runtime_s[rows],
            runtime_upper_s=self.runtime_upper_s[rows],
            breakdown_gib={k: v[rows] for k, v in self.breakdown_gib.items()},
            step_time_s=self.step_time_s[rows],
            ttft_s=self.ttft_s[rows],
            tpot_s=self.tpot_s[rows],
            fits=self.fits[rows],
            method=tuple(self.method[i] for i in np.asarray(rows).tolist()),
            busy_frac=None if self.busy_frac is None else self.busy_frac[rows],
        )

    def iter_dicts(self, gpus_per_job: list[list[str]] | None = None) -> Iterator[dict[str, Any]]:
        """Contract-shaped dicts, job-major, built straight from the arrays.

        ``gpus_per_job`` restricts which GPU types each job gets (pinned jobs). This is the
        fast path for bulk output: no per-object validation, the arrays are already checked.
        """
        cols = {name: k for k, name in enumerate(self.gpu_names)}
        bkeys = list(self.breakdown_gib)
        peak, upper, runtime, runtime_up, *bvals = _rounded_lists(
            [
                self.peak_vram_gib,
                self.peak_vram_upper_gib,
                self.runtime_s,
                self.runtime_upper_s,
                *self.breakdown_gib.values(),
            ],
            3,
        )
        fits: Any = self.fits.tolist()
        breakdown = dict(zip(bkeys, bvals, strict=True))
        optional = dict(
            zip(
                ("step_time_s", "ttft_s", "tpot_s"),
                _rounded_lists([self.step_time_s, self.ttft_s, self.tpot_s], 6, floats=True),
                strict=True,
            )
        )
        for i, job_id in enumerate(self.job_ids):
            names = gpus_per_job[i] if gpus_per_job is not None else self.gpu_names
            method = self.method[i]
            fits_i, peak_i, upper_i = fits[i], peak[i], upper[i]
            runtime_i, runtime_up_i = runtime[i], runtime_up[i]
            breakdown_i = [(k, v[i]) for k, v in breakdown.items()]
            optional_i = [(k, v[i]) for k, v in optional.items()]
            for name in names:
                j = cols[name]
                row: dict[str, Any] = {
                    "id": job_id,
                    "gpu": name,
                    "fits": fits_i[j],
                    "peak_vram_gib": peak_i[j],
                    "peak_vram_upper_gib": upper_i[j],
                    "breakdown_gib": {k: v[j] for k, v in breakdown_i},
                    "runtime_s": runtime_i[j],
                    "runtime_upper_s": runtime_up_i[j],
                }
                for key, vals in optional_i:
                    v = vals[j]
                    row[key] = None if v != v else v  # NaN -> null
                row["method"] = method
                yield row

    def to_predictions(self, gpus_per_job: list[list[str]] | None = None) -> list[Prediction]:
        """Contract objects, job-major; ``gpus_per_job`` restricts which GPU types each job gets."""
        return [Prediction.model_construct(**d) for d in self.iter_dicts(gpus_per_job)]

    def prediction(self, i: int, j: int) -> Prediction:
        sub = PredictionTable(
            job_ids=(self.job_ids[i],),
            gpu_names=(self.gpu_names[j],),
            peak_vram_gib=self.peak_vram_gib[i : i + 1, j : j + 1],
            peak_vram_upper_gib=self.peak_vram_upper_gib[i : i + 1, j : j + 1],
            runtime_s=self.runtime_s[i : i + 1, j : j + 1],
            runtime_upper_s=self.runtime_upper_s[i : i + 1, j : j + 1],
            breakdown_gib={k: v[i : i + 1, j : j + 1] for k, v in self.breakdown_gib.items()},
            step_time_s=self.step_time_s[i : i + 1, j : j + 1],
            ttft_s=self.ttft_s[i : i + 1, j : j + 1],
            tpot_s=self.tpot_s[i : i + 1, j : j + 1],
            fits=self.fits[i : i + 1, j : j + 1],
            method=(self.method[i],),
            busy_frac=None if self.busy_frac is None else self.busy_frac[i : i + 1, j : j + 1],
        )
        return Prediction.model_validate(next(sub.iter_dicts()))


TableFn = Callable[[Sequence[Any], Sequence[str] | None], PredictionTable]


def contract_rows(
    table_fn: TableFn, specs: Sequence[Any], gpus: Sequence[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The CLI contract: each job on its pinned ``gpu``, else on ``gpus``, else on every type."""
    names = tuple(gpus) if gpus else GPU_NAMES
    wanted = sorted({s.gpu for s in specs if s.gpu} | set(names), key=GPU_NAMES.index)
    table = table_fn(specs, wanted)
    per_job = [[s.gpu] if s.gpu else list(names) for s in specs]
    return table.iter_dicts(per_job)


def _rounded_lists(
    arrays: Sequence[np.ndarray], decimals: int, *, floats: bool = False
) -> list[Any]:
    """``np.round(a, decimals).tolist()`` for each array (``floats``: as float64, NaN kept),
    in one rounding pass when they share a shape and dtype: a one-job table's dozen tiny
    arrays cost more in per-call numpy overhead than in arithmetic. Rounding is elementwise,
    so stacking changes no value."""

    def rounded(a: np.ndarray) -> np.ndarray:
        r = np.round(a, decimals)
        return np.where(np.isnan(a), np.nan, r) if floats else r

    first = arrays[0]
    if all(a.shape == first.shape and a.dtype == first.dtype for a in arrays):
        out: list[Any] = rounded(np.array(arrays)).tolist()
        return out
    return [rounded(a).tolist() for a in arrays]
