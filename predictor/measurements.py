"""Measured job runs: one row schema for published figures, profiling runs and worker history.

Every source of ground truth the predictor learns from is the same kind of fact: *this job ran
on this GPU and used this much memory / took this long*. Keeping a single wide row (one line of
JSONL per measured run) means the learned tier, the history tier and the accuracy report read
published tables, the profiling harness and the cluster's own history through one loader.

Row fields (JSON; ``MeasurementRow`` validates them at the file boundary):

===================  ==========================================================================
``id``               unique row id (string)
``origin``           ``published`` | ``profile`` | ``history``
``simulated``        true for rows a simulated worker produced; excluded from training by default
``source``           citation (URL / repo@commit / "node gpu-07, job abc") – required
``spec``             a JobSpec dict that :func:`predictor.spec.parse_spec` accepts
``gpu``              catalogue GPU name (``H100-80GB`` ...) or null when the GPU is not one
``gpu_model``        the raw GPU string as reported ("A10G 24GB", "NVIDIA H100 80GB HBM3")
``gpu_memory_gib``   memory of that GPU in GiB, when known
``peak_vram_gib``    measured peak per GPU, GiB (2**30 bytes)
``measurement``      what the peak counts: ``allocated`` (torch max_memory_allocated / active),
                     ``reserved`` (caching allocator reserved), ``nvml_used`` (nvidia-smi / NVML,
                     includes the CUDA context), ``unknown``
``step_time_s``      seconds per optimizer step (training)
``ttft_s``           seconds to prefill one batch of ``batch_size`` sequences (inference)
``tpot_s``           seconds per decode step of that batch (inference)
``runtime_s``        seconds for the whole job as specified
``oom``              true when the run died of CUDA OOM (``peak_vram_gib`` is then a lower bound)
``confidence``       ``high`` | ``medium`` | ``low``
``date``             ISO date of the measurement or publication, when known
``hardware``         free-form dict (node, driver, interconnect ...)
``software``         free-form dict (framework versions ...)
``notes``            free text: conversions made, caveats
===================  ==========================================================================

At least one of ``peak_vram_gib``, ``step_time_s``, ``ttft_s``, ``tpot_s``, ``runtime_s`` must
be present: a row that measured nothing teaches nothing.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ._paths import datasets_dir
from .exceptions import DataError, SpecError
from .gpus import GPU_NAMES
from .spec import JobSpec, parse_spec

__all__ = [
    "CHECK_TAG",
    "CONFIDENCES",
    "LOW_CONFIDENCE",
    "MEASUREMENT_KINDS",
    "METRICS",
    "ORIGINS",
    "QUIRK_TAG",
    "Measurement",
    "MeasurementRow",
    "append_measurement",
    "calibration_exclusion",
    "default_measurement_paths",
    "is_quirk",
    "load_measurements",
    "measurement_row",
    "measurements_from_lines",
    "parse_measurement",
]

ORIGINS: tuple[str, ...] = ("published", "profile", "history")
MEASUREMENT_KINDS: tuple[str, ...] = ("allocated", "reserved", "nvml_used", "unknown")
CONFIDENCES: tuple[str, ...] = ("high", "medium", "low")
#: The measured quantities a row may carry, in the order reports list them.
METRICS: tuple[str, ...] = ("peak_vram_gib", "step_time_s", "ttft_s", "tpot_s", "runtime_s")

#: Marker in ``notes`` of a row whose value is a documented artefact of its source's code (see
#: datasets/measured/README.md): scored, but never used to train or calibrate.
QUIRK_TAG = "[quirk:"
#: Marker of a row that failed a data check (``predictor._checks``): a kind of quirk.
CHECK_TAG = "[quirk:check-"

Origin = Literal["published", "profile", "history"]
Kind = Literal["allocated", "reserved", "nvml_used", "unknown"]
Confidence = Literal["high", "medium", "low"]


class MeasurementRow(BaseModel):
    """The JSON form of one measured run, validated strictly (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=300)
    origin: Origin
    simulated: bool = False
    source: str = Field(min_length=1)
    spec: dict[str, Any]
    gpu: str | None = None
    gpu_model: str | None = None
    gpu_memory_gib: float | None = Field(default=None, gt=0)
    peak_vram_gib: float | None = Field(default=None, gt=0)
    measurement: Kind = "unknown"
    step_time_s: float | None = Field(default=None, gt=0)
    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    runtime_s: float | None = Field(default=None, gt=0)
    oom: bool = False
    confidence: Confidence = "medium"
    date: str | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    software: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        if v is not None and v not in GPU_NAMES:
            raise ValueError(
                f"gpu {v!r} is not a catalogue GPU type; use one of {', '.join(GPU_NAMES)} "
                "or null (keep the raw name in gpu_model)"
            )
        return v

    @model_validator(mode="after")
    def _measured_something(self) -> MeasurementRow:
        if all(getattr(self, m) is None for m in METRICS) and not self.oom:
            raise ValueError(
                f"row {self.id!r} measures nothing; give at least one of {', '.join(METRICS)}"
            )
        return self


@dataclass(frozen=True, slots=True)
class Measurement:
    """One validated measured run, with its spec already parsed."""

    id: str
    origin: str
    simulated: bool
    source: str
    spec: JobSpec
    gpu: str | None
    gpu_model: str | None
    gpu_memory_gib: float | None
    peak_vram_gib: float | None
    measurement: str
    step_time_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    runtime_s: float | None
    oom: bool
    confidence: str
    date: str | None
    hardware: Mapping[str, Any] = field(default_factory=dict)
    software: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""

    def value(self, metric: str) -> float | None:
        """The measured value of ``metric`` (one of :data:`METRICS`), or None."""
        if metric not in METRICS:
            raise DataError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
        v: float | None = getattr(self, metric)
        return v

    def to_row(self) -> dict[str, Any]:
        """The JSON form, ready for a JSONL line."""
        row = {
            "id": self.id,
            "origin": self.origin,
            "simulated": self.simulated,
            "source": self.source,
            "spec": self.spec.to_dict(),
            "gpu": self.gpu,
            "gpu_model": self.gpu_model,
            "gpu_memory_gib": self.gpu_memory_gib,
            "peak_vram_gib": self.peak_vram_gib,
            "measurement": self.measurement,
            "step_time_s": self.step_time_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "runtime_s": self.runtime_s,
            "oom": self.oom,
            "confidence": self.confidence,
            "date": self.date,
            "hardware": dict(self.hardware),
            "software": dict(self.software),
            "notes": self.notes,
        }
        return row


def is_quirk(m: Measurement) -> bool:
    """True for rows tagged with a documented source quirk or a failed data check."""
    return QUIRK_TAG in m.notes


#: :func:`calibration_exclusion`'s reason for a row its source marks as unsure.
LOW_CONFIDENCE = "low confidence"


def calibration_exclusion(m: Measurement) -> str | None:
    """Why a row may not calibrate an upper bound (None when it may).

    A bound calibrated on rows the source itself flags as unsure, or on artefacts of one
    tool's code, is wide for every job because of those few rows.
    """
    if CHECK_TAG in m.notes:
        return "fails a data check (physics or sibling rows)"
    if is_quirk(m):
        return "documented quirk of its source"
    if m.confidence == "low":
        return LOW_CONFIDENCE
    if m.oom:
        return "OOM run: the peak is a lower bound"
    return None


def parse_measurement(data: Mapping[str, Any] | MeasurementRow) -> Measurement:
    """Validate one row (dict or :class:`MeasurementRow`); raise :class:`DataError` if bad."""
    try:
        row = data if isinstance(data, MeasurementRow) else MeasurementRow.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "row"
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"`{loc}`: {msg} (got {err.get('input')!r:.80})")
        raise DataError("; ".join(parts)) from None
    try:
        spec = parse_spec(row.spec)
    except SpecError as exc:
        raise DataError(f"row {row.id!r}: `spec` is not a valid JobSpec: {exc}") from None
    # Every field but the parsed spec is the validated row's own, by the same name.
    same = {f.name: getattr(row, f.name) for f in fields(Measurement) if f.name != "spec"}
    return Measurement(spec=spec, **same)


def measurement_row(
    *,
    id: str,
    origin: str,
    source: str,
    spec: Mapping[str, Any] | JobSpec,
    gpu: str | None = None,
    gpu_model: str | None = None,
    gpu_memory_gib: float | None = None,
    peak_vram_gib: float | None = None,
    measurement: str = "unknown",
    step_time_s: float | None = None,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    runtime_s: float | None = None,
    oom: bool = False,
    simulated: bool = False,
    confidence: str = "medium",
    date: str | None = None,
    hardware: Mapping[str, Any] | None = None,
    software: Mapping[str, Any] | None = None,
    notes: str = "",
) -> dict[str, Any]:
    """Build and validate one row dict (what :func:`append_measurement` writes).

    Workers and the profiling harness call this so a bad row fails where it is made, not
    later when the trainer reads the file.
    """
    spec_dict = spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)
    row: dict[str, Any] = {
        "id": id,
        "origin": origin,
        "simulated": simulated,
        "source": source,
        "spec": spec_dict,
        "gpu": gpu,
        "gpu_model": gpu_model,
        "gpu_memory_gib": gpu_memory_gib,
        "peak_vram_gib": peak_vram_gib,
        "measurement": measurement,
        "step_time_s": step_time_s,
        "ttft_s": ttft_s,
        "tpot_s": tpot_s,
        "runtime_s": runtime_s,
        "oom": oom,
        "confidence": confidence,
        "date": date,
        "hardware": dict(hardware or {}),
        "software": dict(software or {}),
        "notes": notes,
    }
    parse_measurement(row)
    return row


def default_measurement_paths() -> list[Path]:
    """Every ``datasets/measured/*.jsonl`` file, sorted so loads are reproducible."""
    return sorted((datasets_dir() / "measured").glob("*.jsonl"))


def _iter_rows(path: Path) -> Iterable[tuple[int, str]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                yield lineno, text


def load_measurements(
    paths: str | Path | Sequence[str | Path] | None = None,
    *,
    include_simulated: bool = False,
    strict: bool = True,
) -> list[Measurement]:
    """Read JSONL measurement files (default: every ``datasets/measured/*.jsonl``).

    A bad row raises :class:`DataError` naming ``file:line``; with ``strict=False`` it is
    skipped with a warning instead. Rows with ``simulated: true`` are dropped unless
    ``include_simulated`` – numbers a simulator invented must never train the predictor.
    Duplicate ids across files are an error, since they would double-count a run.
    """
    if paths is None:
        files = default_measurement_paths()
    elif isinstance(paths, str | Path):
        files = [Path(paths)]
    else:
        files = [Path(p) for p in paths]
    out: list[Measurement] = []
    seen: dict[str, str] = {}
    for path in files:
        if not path.exists():
            raise DataError(f"measurement file {str(path)!r} does not exist; check the path")
        _parse_lines(
            ((f"{path}:{n}", t) for n, t in _iter_rows(path)),
            out,
            seen,
            include_simulated=include_simulated,
            strict=strict,
        )
    return out


def measurements_from_lines(
    lines: Iterable[str | bytes],
    where: str,
    *,
    include_simulated: bool = False,
    strict: bool = True,
) -> list[Measurement]:
    """Parse JSON rows that did not come from a file (e.g. the Redis history list).

    ``where`` names the origin in error messages (``redis://…/snugfit:history``); rows are
    numbered from 1 as if they were lines of a file.
    """
    out: list[Measurement] = []
    items = (
        (f"{where}[{i}]", raw.decode() if isinstance(raw, bytes) else raw)
        for i, raw in enumerate(lines, 1)
    )
    _parse_lines(items, out, {}, include_simulated=include_simulated, strict=strict)
    return out


def _parse_lines(
    items: Iterable[tuple[str, str]],
    out: list[Measurement],
    seen: dict[str, str],
    *,
    include_simulated: bool,
    strict: bool,
) -> None:
    for where, text in items:
        try:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"a row must be a JSON object, got {type(obj).__name__}")
            m = parse_measurement(obj)
            if m.id in seen:
                raise DataError(f"duplicate id {m.id!r} (first seen at {seen[m.id]})")
        except DataError as exc:
            if strict:
                raise DataError(f"{where}: {exc}") from None
            warnings.warn(f"skipping {where}: {exc}", stacklevel=2)
            continue
        seen[m.id] = where
        if m.simulated and not include_simulated:
            continue
        out.append(m)


def append_measurement(path: str | Path, row: Mapping[str, Any] | Measurement) -> None:
    """Validate ``row`` and append it as one JSONL line (creating the file and folders).

    One ``write`` of a whole line keeps concurrent appenders on a local file from
    interleaving partial rows.
    """
    data = row.to_row() if isinstance(row, Measurement) else dict(row)
    parse_measurement(data)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
    with p.open("a", encoding="utf-8") as fh:
        fh.write(line)
