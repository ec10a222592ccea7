"""The JSON records stored in a job hash, validated on every read: anyone with write access
to Redis can put anything there, and the service must reject it, never crash or execute it.
The layout they live in is documented in :mod:`scheduler.service.store.keys`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from predictor.gpus import GPU_NAMES
from predictor.limits import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_HOST_MEMORY_GIB,
    MAX_PARALLEL,
    MAX_PRIORITY,
    MAX_RUNTIME_S,
    MAX_VRAM_GIB,
    MIN_PRIORITY,
)

if TYPE_CHECKING:
    from scheduler.service.store.protocol import Store

__all__ = [
    "OutcomeRecord",
    "PlacementRecord",
    "RequestRecord",
    "current_placements",
    "dumps",
    "parse_engine",
]


def dumps(obj: Any) -> str:
    """Compact JSON with inf/NaN turned into null (JSON has neither).

    orjson writes every record of the hot path (it turns inf/NaN into null itself, and numpy
    scalars into numbers); :func:`_clean` and the standard library take what it refuses, such
    as non-string keys.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        pass
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
        return obj if math.isfinite(obj) else None  # JSON has no inf/NaN
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
    # The same bounds as JobSpec (predictor.limits), so what the client accepts is placeable.
    n_gpus: int = Field(default=1, ge=1, le=MAX_GPUS)
    tensor_parallel: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    pipeline_parallel: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    gpu: str | None = None
    requested_gpu: str | None = None
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    deadline_s: float | None = Field(default=None, ge=0, le=MAX_RUNTIME_S)
    # Host resources: the spec's own figures (None: the node's share) and the predictor's host
    # memory estimate under the share; absent in older records.
    cpus: float | None = Field(default=None, ge=0.001, le=MAX_CPUS, allow_inf_nan=False)
    host_memory_gib: float | None = Field(
        default=None, gt=0, le=MAX_HOST_MEMORY_GIB, allow_inf_nan=False
    )
    host_memory_floor_gib: float = Field(
        default=0.0, ge=0, le=MAX_HOST_MEMORY_GIB, allow_inf_nan=False
    )
    # Inter-node traffic of a multi-GPU training job (predictor.internode): [steps, gradient
    # bytes per GPU per step, data-parallel degree, inter-node seconds the predicted runtime
    # already charges, pipeline activation bytes per micro-batch and boundary, micro-batches
    # per step]; the last two absent in older records, the whole list for inference.
    sync: list[float] | None = Field(default=None, min_length=4, max_length=6)
    # The spec's node selector (predictor/_node_selector.py); absent: any node.
    node_selector: dict[str, list[str]] | None = Field(default=None, max_length=64)

    @field_validator("sync")
    @classmethod
    def _finite_sync(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        if len(v) == 5 or not all(math.isfinite(x) and 0 <= x <= 1e30 for x in v):
            raise ValueError(f"sync must be 4 or 6 finite non-negative figures; got {v!r}")
        return v

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

    @field_validator("vram_gib", "vram_upper_gib")
    @classmethod
    def _vram(cls, v: list[float | None]) -> list[float | None]:
        # Every job holds at least a CUDA context: a 0 GiB request would take a shared slot
        # for nothing.
        for x in v:
            if x is not None and not (math.isfinite(x) and 0 < x <= MAX_VRAM_GIB):
                raise ValueError(
                    f"VRAM values must be in (0, {MAX_VRAM_GIB:g}] GiB or null; got {x!r}"
                )
        return v

    @field_validator("runtime_s", "runtime_upper_s")
    @classmethod
    def _runtime(cls, v: list[float | None]) -> list[float | None]:
        for x in v:
            if x is not None and not (math.isfinite(x) and 0 <= x <= MAX_RUNTIME_S):
                raise ValueError(f"runtimes must be in [0, {MAX_RUNTIME_S:g}] s or null; got {x!r}")
        return v


class GangRank(BaseModel):
    """One node of a multi-node gang: its RQ job, its share of the GPUs (pool indices) and
    where its ranks start (``RANK`` of its first local rank = ``rank_offset``)."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=_MAX_ID_CHARS)
    queue: str
    rq_job_id: str
    node_rank: int = Field(ge=0)
    rank_offset: int = Field(ge=0)
    gpu_indices: list[int]


class PlacementRecord(BaseModel):
    """The ``placement`` field of a job record: where one attempt runs.

    It is the one record of a placement: the commit's Lua arguments and allocation, the RQ
    ``job.meta`` and the ``placed`` event are all derived from it
    (:mod:`scheduler.service._commit`). Fields after ``simulated`` were added later and
    default so that older records still read.
    """

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
    job_id: str | None = None
    n_gpus: int | None = None
    vram_gib: float | None = None
    vram_upper_gib: float | None = None
    leftover_gib: float | None = None
    #: MiB each GPU in ``gpu_indices`` is charged (what the commit adds and the release takes).
    used_mib: int | None = None
    mig_mask: int = 0
    #: Why this option won, and the runner-up option with why it lost.
    reason: str = ""
    runner_up: dict[str, Any] | None = None
    # A serving replica's engine values (``predictor.serving.ENGINE_PLACEHOLDERS``), for the
    # worker's placeholder substitution; None for batch jobs.
    engine: dict[str, str] | None = None
    #: CPUs and host memory the attempt holds on its node (None: records from before they
    #: were accounted, which hold none).
    cpus: float | None = None
    host_memory_gib: float | None = None
    #: A multi-node gang (scheduler.core.gang): its nodes in rank order, node 0 being ``node``
    #: (the rendezvous master), and the rendezvous port; None for single-node placements.
    #: ``cpus`` and ``host_memory_gib`` are then what each node gives.
    gang: list[GangRank] | None = None
    master_port: int | None = None

    @property
    def n_nodes(self) -> int:
        return 1 if self.gang is None else len(self.gang)


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


def current_placements(store: Store, ids: Sequence[str]) -> list[tuple[str, PlacementRecord]]:
    """``(job id, placement)`` of the jobs ``ids`` whose stored placement is valid and belongs
    to their current attempt: a stale attempt's record, or one that fails validation (or an
    attempt field that is not an integer), is skipped, so what follows never acts on an
    attempt that is over."""
    found: list[tuple[str, PlacementRecord]] = []
    rows = store.get_fields(ids, ["placement", "attempt"])
    for jid, (raw, attempt) in zip(ids, rows, strict=True):
        try:
            p = PlacementRecord.model_validate_json(raw or "")
            current = attempt is not None and int(attempt) == p.attempt
        except (ValidationError, ValueError):
            continue
        if current:
            found.append((jid, p))
    return found
