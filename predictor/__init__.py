"""snugfit predictor: job spec → per-GPU peak VRAM and runtime (analytical, traced, learned,
history; the traced tier is the `predictor.traced` sub-package)."""

from .analytical import AnalyticalPredictor, predict, predict_table
from .exceptions import (
    ArtifactError,
    DataError,
    NotFittedError,
    PredictorError,
    SpecError,
    UnknownGpuError,
    UnknownModelError,
)
from .gpus import GPU_NAMES, GpuType, MigProfile, get_gpu, gpu_catalogue, with_prices
from .models import ModelArch, catalogue, resolve_model
from .prediction import BREAKDOWN_KEYS, Prediction, PredictionTable
from .spec import DType, Framework, JobSpec, LoraTarget, Optimizer, Task, load_specs, parse_spec

__all__ = [
    "BREAKDOWN_KEYS",
    "GPU_NAMES",
    "AnalyticalPredictor",
    "ArtifactError",
    "DType",
    "DataError",
    "Framework",
    "GpuType",
    "JobSpec",
    "LoraTarget",
    "MigProfile",
    "ModelArch",
    "NotFittedError",
    "Optimizer",
    "Prediction",
    "PredictionTable",
    "PredictorError",
    "SpecError",
    "Task",
    "UnknownGpuError",
    "UnknownModelError",
    "catalogue",
    "get_gpu",
    "gpu_catalogue",
    "load_specs",
    "parse_spec",
    "predict",
    "predict_table",
    "resolve_model",
    "with_prices",
]
