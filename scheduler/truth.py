"""Ground truth for the simulator: how far real jobs land from the analytical prediction.

A simulated job's *true* peak VRAM and runtime are the analytical figures times an error factor
``exp(r)``, with ``r`` drawn from the empirical distribution of ``log(measured / analytical)``
on real measured runs (``datasets/measured``). So prediction error, and the OOMs it causes,
happen in simulation as they would on a cluster; the predictor never grades itself.

The distribution is stored as quantiles in ``datasets/workloads/residuals.json`` together with
its provenance; regenerate it with ``python -m scheduler.truth``. Sampling interpolates the
inverse CDF between stored quantiles (clamped to the observed range, so no invented tails).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .exceptions import SimulationError

__all__ = [
    "PLACEHOLDER_RESIDUALS",
    "RESIDUALS_PATH",
    "ResidualModel",
    "fit_residuals",
    "load_residuals",
]

RESIDUALS_PATH = Path(__file__).resolve().parent.parent / "datasets/workloads/residuals.json"
_QUANTILE_LEVELS = tuple(round(x, 3) for x in np.linspace(0.0, 1.0, 41))
REGENERATE = ".venv/bin/python -m scheduler.truth"

# Used only when no measured rows are available: log-normal with sigma 0.08 for VRAM (allocator
# and framework overhead the analytical model misses) and 0.30 for runtime (MFU varies widely),
# centred at zero. Documented so simulations never silently depend on it.
PLACEHOLDER_RESIDUALS: dict[str, Any] = {
    "source": "placeholder: lognormal(0, 0.08) VRAM, lognormal(0, 0.30) runtime",
}


@dataclass(frozen=True, slots=True)
class ResidualModel:
    """Quantiles of log(measured / analytical) for VRAM and runtime."""

    levels: np.ndarray  # (Q,) in [0, 1]
    vram_log: np.ndarray  # (Q,) non-decreasing
    runtime_log: np.ndarray  # (Q,) non-decreasing
    provenance: dict[str, Any]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` independent (VRAM factor, runtime factor) draws, as multiplicative factors."""
        u1 = rng.random(n)
        u2 = rng.random(n)
        return (
            np.exp(np.interp(u1, self.levels, self.vram_log)),
            np.exp(np.interp(u2, self.levels, self.runtime_log)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": [float(x) for x in self.levels],
            "vram_log_ratio_quantiles": [round(float(x), 6) for x in self.vram_log],
            "runtime_log_ratio_quantiles": [round(float(x), 6) for x in self.runtime_log],
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResidualModel:
        try:
            levels = np.asarray(data["levels"], float)
            vram = np.asarray(data["vram_log_ratio_quantiles"], float)
            runtime = np.asarray(data["runtime_log_ratio_quantiles"], float)
        except (KeyError, TypeError, ValueError) as exc:
            raise SimulationError(
                f"residual file is malformed ({exc}); regenerate it with `{REGENERATE}`"
            ) from None
        if not (levels.shape == vram.shape == runtime.shape) or levels.size < 2:
            raise SimulationError(
                f"residual quantile arrays must have one equal length >= 2; got "
                f"{levels.size}, {vram.size}, {runtime.size}. Regenerate with `{REGENERATE}`"
            )
        return cls(levels, np.sort(vram), np.sort(runtime), dict(data.get("provenance", {})))

    @classmethod
    def placeholder(cls) -> ResidualModel:
        from statistics import NormalDist

        levels = np.asarray(_QUANTILE_LEVELS)
        # Clip the 0/1 levels at 0.1%/99.9% so the tails stay finite.
        z = np.array([NormalDist().inv_cdf(min(max(q, 0.001), 0.999)) for q in levels])
        return cls(levels, 0.08 * z, 0.30 * z, dict(PLACEHOLDER_RESIDUALS))


def _quantiles(x: np.ndarray) -> np.ndarray:
    return np.quantile(x, np.asarray(_QUANTILE_LEVELS))


def fit_residuals(min_rows: int = 10) -> ResidualModel:
    """Measured/analytical log-ratios on every real measured run; placeholder if too few.

    VRAM uses every row with a measured peak (the analytical peak on the row's GPU type, or on
    an H100-80GB when the row's GPU is not in the catalogue: the memory model barely depends on
    the GPU). Runtime uses rows on catalogue GPUs with a measured step time or runtime.
    """
    from predictor.analytical import predict_table
    from predictor.measurements import load_measurements

    rows = load_measurements(strict=False)
    vram: list[float] = []
    runtime: list[float] = []
    for m in rows:
        gpu = m.gpu or "H100-80GB"
        try:
            t = predict_table([m.spec], [gpu])
        except Exception:
            continue
        if m.peak_vram_gib is not None and m.peak_vram_gib > 0 and not m.oom:
            pred = float(t.peak_vram_gib[0, 0])
            if pred > 0 and math.isfinite(pred):
                vram.append(math.log(m.peak_vram_gib / pred))
        if m.gpu is None:
            continue
        if m.step_time_s is not None and m.step_time_s > 0:
            pred = float(t.step_time_s[0, 0])
            if pred > 0 and math.isfinite(pred):
                runtime.append(math.log(m.step_time_s / pred))
        elif m.runtime_s is not None and m.runtime_s > 0:
            pred = float(t.runtime_s[0, 0])
            if pred > 0 and math.isfinite(pred):
                runtime.append(math.log(m.runtime_s / pred))
    base = ResidualModel.placeholder()
    v = _quantiles(np.asarray(vram)) if len(vram) >= min_rows else base.vram_log
    r = _quantiles(np.asarray(runtime)) if len(runtime) >= min_rows else base.runtime_log
    provenance = {
        "regenerate": REGENERATE,
        "data": "datasets/measured/*.jsonl (non-simulated rows), predictor.analytical",
        "n_vram_rows": len(vram),
        "n_runtime_rows": len(runtime),
        "vram_source": "measured" if len(vram) >= min_rows else PLACEHOLDER_RESIDUALS["source"],
        "runtime_source": "measured"
        if len(runtime) >= min_rows
        else PLACEHOLDER_RESIDUALS["source"],
    }
    return ResidualModel(np.asarray(_QUANTILE_LEVELS), v, r, provenance)


def load_residuals(path: str | Path = RESIDUALS_PATH) -> ResidualModel:
    """The stored residual model; the documented placeholder if the file is missing."""
    p = Path(path)
    if not p.exists():
        return ResidualModel.placeholder()
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise SimulationError(
            f"{p}: not valid JSON ({exc.msg}); regenerate it with `{REGENERATE}`"
        ) from None
    return ResidualModel.from_dict(data)


def main() -> None:
    model = fit_residuals()
    RESIDUALS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESIDUALS_PATH.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    print(json.dumps(model.provenance))


if __name__ == "__main__":
    main()
