"""The Prediction contract (one per job per GPU type) and its array form for the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["BREAKDOWN_KEYS", "Prediction", "PredictionTable"]

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

    def __len__(self) -> int:
        return len(self.job_ids)

    def column(self, gpu: str) -> int:
        return self.gpu_names.index(gpu)

    def to_predictions(self, gpus_per_job: list[list[str]] | None = None) -> list[Prediction]:
        """Contract objects, job-major; ``gpus_per_job`` restricts which GPU types each job gets."""
        out: list[Prediction] = []
        for i, job_id in enumerate(self.job_ids):
            names = gpus_per_job[i] if gpus_per_job is not None else self.gpu_names
            for name in names:
                j = self.gpu_names.index(name)
                out.append(self.prediction(i, j, job_id))
        return out

    def prediction(self, i: int, j: int, job_id: str | None = None) -> Prediction:
        def opt(a: np.ndarray) -> float | None:
            v = float(a[i, j])
            return None if np.isnan(v) else round(v, 6)

        return Prediction(
            id=job_id if job_id is not None else self.job_ids[i],
            gpu=self.gpu_names[j],
            fits=bool(self.fits[i, j]),
            peak_vram_gib=round(float(self.peak_vram_gib[i, j]), 3),
            peak_vram_upper_gib=round(float(self.peak_vram_upper_gib[i, j]), 3),
            breakdown_gib={k: round(float(v[i, j]), 3) for k, v in self.breakdown_gib.items()},
            runtime_s=round(float(self.runtime_s[i, j]), 3),
            runtime_upper_s=round(float(self.runtime_upper_s[i, j]), 3),
            step_time_s=opt(self.step_time_s),
            ttft_s=opt(self.ttft_s),
            tpot_s=opt(self.tpot_s),
            method=self.method[i],
        )
