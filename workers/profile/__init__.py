"""The profiling harness: run jobs for real on the local GPU and record measurements."""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ProfileSummary": "workers.profile.run",
    "run_calibration": "workers.profile.run",
    "run_profile": "workers.profile.run",
    "h200_jobs": "workers.profile.sweep",
    "write_sweep": "workers.profile.sweep",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
