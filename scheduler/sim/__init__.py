"""The discrete-event simulator on the shared core: ground truth, workloads, outcome metrics,
feedback history, and ``openb/`` for the Alibaba trace replay. Every result is simulated and
labelled so.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "SimulationResult": "scheduler.sim.simulator",
    "Simulator": "scheduler.sim.simulator",
    "simulate": "scheduler.sim.simulator",
    "FeedbackHistory": "scheduler.sim.feedback",
    "SimulationMetrics": "scheduler.sim.outcomes",
    "compute_metrics": "scheduler.sim.outcomes",
    "ResidualModel": "scheduler.sim.truth",
    "load_residuals": "scheduler.sim.truth",
    "draw_truth": "scheduler.sim.truth",
    "oom_fraction": "scheduler.sim.truth",
    "Mix": "scheduler.sim.workload",
    "Workload": "scheduler.sim.workload",
    "generate_workload": "scheduler.sim.workload",
    "load_mix": "scheduler.sim.workload",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
