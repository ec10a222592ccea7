"""The analytical tier: a pure function of (spec, GPU type) → peak VRAM breakdown and runtime.

It needs no data and no fitting, so it answers for any job and any GPU, and the learned tier
corrects it. Upper bounds here come from a fixed, documented margin (the learned tier replaces
it with calibrated conformal bounds):

* VRAM: ``upper = peak × (1 + VRAM_MARGIN_FRACTION) + VRAM_MARGIN_GIB``
* runtime: ``upper = runtime × RUNTIME_MARGIN_FACTOR``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ._jobarrays import job_arrays
from ._memory import GIB, MemoryModel, memory_breakdown_gib
from ._runtime import RuntimeModel, runtime_figures
from .gpus import GPU_NAMES, GpuType, get_gpu
from .prediction import BREAKDOWN_KEYS, Prediction, PredictionTable, contract_rows
from .spec import JobSpec

__all__ = [
    "METHOD",
    "RUNTIME_MARGIN_FACTOR",
    "VRAM_MARGIN_FRACTION",
    "VRAM_MARGIN_GIB",
    "AnalyticalPredictor",
    "predict",
    "predict_table",
]

METHOD = "analytical"
VRAM_MARGIN_FRACTION = 0.10
VRAM_MARGIN_GIB = 0.5
RUNTIME_MARGIN_FACTOR = 1.5


@dataclass(frozen=True)
class AnalyticalPredictor:
    memory_model: MemoryModel = field(default_factory=MemoryModel)
    runtime_model: RuntimeModel = field(default_factory=RuntimeModel)

    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable:
        gpu_names = tuple(gpus) if gpus is not None else GPU_NAMES
        gpu_types: list[GpuType] = [get_gpu(g) for g in gpu_names]
        n = len(specs)
        if n == 0:
            empty = np.zeros((0, len(gpu_names)))
            return PredictionTable(
                job_ids=(),
                gpu_names=gpu_names,
                peak_vram_gib=empty,
                peak_vram_upper_gib=empty,
                runtime_s=empty,
                runtime_upper_s=empty,
                breakdown_gib={k: empty for k in BREAKDOWN_KEYS},
                step_time_s=empty,
                ttft_s=empty,
                tpot_s=empty,
                fits=empty.astype(bool),
                method=(),
            )
        j = job_arrays(specs)
        breakdown = memory_breakdown_gib(j, gpu_names, self.memory_model)
        peak: np.ndarray = np.sum([breakdown[k] for k in BREAKDOWN_KEYS], axis=0)
        upper = peak * (1.0 + VRAM_MARGIN_FRACTION) + VRAM_MARGIN_GIB
        weights_bytes = breakdown["weights"][:, 0] * GIB
        rt = runtime_figures(j, gpu_types, weights_bytes, self.runtime_model)
        capacity = np.array([g.memory_gib for g in gpu_types])[None, :]
        return PredictionTable(
            job_ids=tuple(s.id for s in specs),
            gpu_names=gpu_names,
            peak_vram_gib=peak,
            peak_vram_upper_gib=upper,
            runtime_s=rt["runtime_s"],
            runtime_upper_s=rt["runtime_s"] * RUNTIME_MARGIN_FACTOR,
            breakdown_gib={k: breakdown[k] for k in BREAKDOWN_KEYS},
            step_time_s=rt["step_time_s"],
            ttft_s=rt["ttft_s"],
            tpot_s=rt["tpot_s"],
            fits=upper <= capacity,
            method=(METHOD,) * n,
            busy_frac=rt["busy_frac"],
        )

    def predict(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> list[Prediction]:
        """Contract predictions: each job on its pinned GPU, else on ``gpus``, else on all."""
        return [
            Prediction.model_construct(**r) for r in contract_rows(self.predict_table, specs, gpus)
        ]


_DEFAULT = AnalyticalPredictor()


def predict_table(specs: Sequence[JobSpec], gpus: Sequence[str] | None = None) -> PredictionTable:
    """Vectorised analytical predictions for every job on every requested GPU type."""
    return _DEFAULT.predict_table(specs, gpus)


def predict(specs: Sequence[JobSpec], gpus: Sequence[str] | None = None) -> list[Prediction]:
    return _DEFAULT.predict(specs, gpus)
