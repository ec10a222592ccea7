"""The JSON records stored in a job hash, validated on every read: anyone with write access
to Redis can put anything there, and the service must reject it, never crash or execute it.
The layout they live in is documented in :mod:`scheduler.service.store.keys`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from predictor.gpus import GPU_NAMES

__all__ = ["OutcomeRecord", "PlacementRecord", "RequestRecord", "dumps", "parse_engine"]


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def dumps(obj: Any) -> str:
    """Compact JSON with inf/NaN turned into null (JSON has neither)."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):
        # The slow path only runs for payloads that really hold inf/NaN or numpy scalars.
        return json.dumps(_clean(obj), separators=(",", ":"), allow_nan=False)


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, float):
        return _finite_or_none(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


_N_TYPES = len(GPU_NAMES)


_MAX_ID_CHARS = 200


class RequestRecord(BaseModel):
    """The ``request`` field of a job record: all the scheduler needs to place the job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vram_gib: list[float | None] = Field(min_length=_N_TYPES, max_length=_N_TYPES)
    vram_upper_gib: list[float | None] = Field(min_length=_N_TYPES, max_length=_N_TYPES)
    runtime_s: list[float | None] = Field(min_length=_N_TYPES, max_length=_N_TYPES)
    runtime_upper_s: list[float | None] = Field(min_length=_N_TYPES, max_length=_N_TYPES)
    # Share of the runtime that saturates the GPU, per type (what stretches on a MIG slice);
    # absent in records written before it existed: treated as 1.
    busy_frac: list[float | None] | None = Field(
        default=None, min_length=_N_TYPES, max_length=_N_TYPES
    )
    n_gpus: int = Field(default=1, ge=1, le=1024)
    tensor_parallel: int = Field(default=1, ge=1, le=1024)
    pipeline_parallel: int = Field(default=1, ge=1, le=1024)
    gpu: str | None = None
    requested_gpu: str | None = None
    priority: int = Field(default=0, ge=-(10**6), le=10**6)
    deadline_s: float | None = Field(default=None, ge=0)

    @field_validator("gpu", "requested_gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        if v is not None and v not in GPU_NAMES:
            raise ValueError(f"gpu {v!r} is not a GPU type; use one of {', '.join(GPU_NAMES)}")
        return v

    @field_validator("busy_frac")
    @classmethod
    def _fraction(cls, v: list[float | None] | None) -> list[float | None] | None:
        for x in v or ():
            if x is not None and not (math.isfinite(x) and 0.0 <= x <= 1.0):
                raise ValueError(f"busy_frac values must be in [0, 1] or null; got {x!r}")
        return v

    @field_validator("vram_gib", "vram_upper_gib", "runtime_s", "runtime_upper_s")
    @classmethod
    def _non_negative(cls, v: list[float | None]) -> list[float | None]:
        for x in v:
            if x is not None and not (math.isfinite(x) and x >= 0):
                raise ValueError(f"values must be finite and >= 0 or null; got {x!r}")
        return v


class PlacementRecord(BaseModel):
    """The ``placement`` field of a job record: where one attempt runs."""

    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(ge=1)
    node: str = Field(min_length=1, max_length=_MAX_ID_CHARS)
    queue: str
    rq_job_id: str
    label: str
    kind: str
    gpu_type: str
    gpu_indices: list[int]
    mig_profile: str | None = None
    mig_start: int | None = None
    reserved_gib: float
    capacity_gib: float
    cost_usd: float | None = None
    runtime_s: float | None = None
    placed_at: float
    policy: str
    simulated: bool = False
    # A serving replica's engine values (``predictor.serving.ENGINE_PLACEHOLDERS``), for the
    # worker's placeholder substitution; None for batch jobs.
    engine: dict[str, str] | None = None


_MAX_ENGINE_BYTES = 4096


def parse_engine(raw: str | None) -> dict[str, str] | None:
    """A job record's ``engine`` field (a serving replica's placeholder values) or None;
    ValueError when it is not a small JSON object of known names to short strings."""
    if raw is None:
        return None
    if len(raw) > _MAX_ENGINE_BYTES:
        raise ValueError(f"`engine` is {len(raw)} bytes (> {_MAX_ENGINE_BYTES})")
    from predictor.serving import ENGINE_PLACEHOLDERS

    got = json.loads(raw)
    if not isinstance(got, dict) or not all(
        k in ENGINE_PLACEHOLDERS and isinstance(v, str) and len(v) <= 64 for k, v in got.items()
    ):
        raise ValueError(
            f"`engine` must map names among {', '.join(ENGINE_PLACEHOLDERS)} to short strings"
        )
    return got


class OutcomeRecord(BaseModel):
    """The ``outcome`` field: what one attempt really did (``simulated`` runs say so)."""

    model_config = ConfigDict(extra="forbid")

    attempt: int
    state: str
    exit_code: int | None = None
    signal: int | None = None
    peak_vram_gib: float | None = None
    runtime_s: float | None = None
    oom: bool = False
    simulated: bool = False
    reason: str = ""
    worker: str | None = None
    node: str | None = None
