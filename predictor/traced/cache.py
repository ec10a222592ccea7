"""On-disk cache of traced peaks, keyed by a fingerprint of everything that changes memory.

One small JSON file per fingerprint under ``$SNUGFIT_HOME/traces/`` (default
``~/.cache/snugfit/traces``): a hit is one file read, well under a millisecond, and never
imports torch. The fingerprint covers the resolved architecture, every shape, dtype and flag of
the spec that the trace or its sharding reads, the installed torch / transformers / peft
versions (read from package metadata, not by importing them) and :data:`TRACER_VERSION`, so a
new library release or a change of the tracer re-traces instead of answering stale figures.

A failed trace is cached too (``status: failed`` with the reason), so the analytical fallback
is recorded and the job is not re-traced on every prediction.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..models import ModelArch
from ..spec import JobSpec

__all__ = [
    "TRACER_VERSION",
    "TraceCache",
    "cache_dir",
    "fingerprint",
    "library_versions",
]

#: Bump when the tracer's semantics change, so old cache entries are not used.
TRACER_VERSION = "18"

# Spec fields that do not change per-GPU memory: they never enter the fingerprint.
# Fields that cannot change a traced peak: identity, placement, scheduling and execution.
_IGNORED = (
    "id",
    "gpu",
    "command",
    "priority",
    "deadline_s",
    "steps",
    "num_requests",
    "time_limit_s",
    "env",
    "workdir",
    "duration_s",
    "depends_on",
    "user",
    "team",
    "cpus",
    "host_memory_gib",
    "max_tensor_parallel",  # permits an OOM retry at another degree; the trace is per degree
)


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str | None]:
    """Installed versions of the traced stack, from metadata (no import: predict stays fast)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cache_dir() -> Path:
    home = os.environ.get("SNUGFIT_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "snugfit"
    return base / "traces"


_KEY_FIELDS = tuple(f for f in JobSpec.model_fields if f not in (*_IGNORED, "model"))


@lru_cache(maxsize=65536)
def _fingerprint_of(arch: ModelArch, values: tuple[Any, ...]) -> str:
    d: dict[str, Any] = {
        f: (v.value if hasattr(v, "value") else v)
        for f, v in zip(_KEY_FIELDS, values, strict=True)
        if v is not None
    }
    model = arch.to_dict()
    for k in ("name", "source", "params_b"):
        model.pop(k, None)
    d["model"] = model
    d["_versions"] = library_versions()
    d["_tracer"] = TRACER_VERSION
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _hashable(v: Any) -> Any:
    # lru_cache keys must hash; a list or mapping field keys by its JSON form.
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, list | dict) else v


def fingerprint(spec: JobSpec) -> str:
    """Stable hex key of what the traced peak depends on (memoised: 10k jobs cost ~10 ms)."""
    return _fingerprint_of(spec.arch, tuple(_hashable(getattr(spec, f)) for f in _KEY_FIELDS))


class TraceCache:
    """JSON files, one per fingerprint; writes are atomic (temp file + rename)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir()
        self._mem: dict[str, dict[str, Any]] = {}

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        hit = self._mem.get(key)
        if hit is not None:
            return hit
        try:
            entry: dict[str, Any] = json.loads(self._path(key).read_text())
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            return None
        self._mem[key] = entry
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
        self._mem[key] = entry

    def lookup(self, spec: JobSpec) -> dict[str, Any] | None:
        return self.get(fingerprint(spec))
