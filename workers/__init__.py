"""snugfit workers: the per-node RQ worker, job execution, NVML sampling, the profiling harness.

Names resolve lazily (PEP 562): importing the package must not pull in torch or NVML.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "NodeWorker": "workers.worker",
    "run_job": "workers.execute",
    "WorkerContext": "workers.execute",
    "SimulatedRun": "workers.simulated",
    "ProcessRun": "workers.process",
    "Runner": "workers.runner",
    "RunResult": "workers.runner",
    "Nvml": "workers.nvml",
    "PynvmlNvml": "workers.nvml",
    "FakeNvml": "workers.nvml",
    "FakeGpu": "workers.nvml",
    "PeakSampler": "workers.nvml",
    "open_nvml": "workers.nvml",
    "run_profile": "workers.profile.run",
    "run_calibration": "workers.profile.run",
    "ProfileSummary": "workers.profile.run",
    "WorkerError": "workers.exceptions",
    "ProfileError": "workers.exceptions",
    "NvmlError": "workers.exceptions",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
