"""Ground truth for the simulator: how far real jobs land from the analytical prediction.

A simulated job's *true* peak VRAM and runtime are the analytical figures times an error factor
``exp(r)``, with ``r`` drawn from the empirical distribution of ``log(measured / analytical)``
on real measured runs (``datasets/measured``). So prediction error, and the OOMs it causes,
happen in simulation as they would on a cluster; the predictor never grades itself.

The distribution is stored as quantiles in ``datasets/workloads/residuals.json`` together with
its provenance; regenerate it with ``python -m scheduler.sim.truth``. Sampling interpolates the
inverse CDF between stored quantiles (clamped to the observed range, so no invented tails).

:func:`draw_truth` is the one ground truth of every simulated run, in the simulator and on a
``--simulate`` worker alike: keyed by (seed, fingerprint) for the recurring job's systematic
error and (seed, fingerprint, run id) for the run-to-run noise, so both draw the same figures
for the same job without sharing any state. :func:`oom_fraction` is where an OOM'ing attempt
dies, keyed the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor._paths import datasets_dir
from scheduler.exceptions import SimulationError

__all__ = [
    "PLACEHOLDER_RESIDUALS",
    "RESIDUALS_PATH",
    "RUN_NOISE_RUNTIME_SIGMA",
    "RUN_NOISE_VRAM_SIGMA",
    "TRIM_FRACTION",
    "ResidualModel",
    "draw_truth",
    "fit_residuals",
    "load_residuals",
    "oom_fraction",
]

RESIDUALS_PATH = datasets_dir() / "workloads" / "residuals.json"
_QUANTILE_LEVELS = tuple(round(x, 3) for x in np.linspace(0.0, 1.0, 41))
REGENERATE = ".venv/bin/python -m scheduler.sim.truth"
# Share of the measured log-ratios dropped before fitting, half from each tail (see fit_residuals).
TRIM_FRACTION = 0.01
# Run-to-run spread of one recurring job (log scale): the peak moves by allocator timing and
# fragmentation (a few %), the runtime by input order, contention and stragglers.
RUN_NOISE_VRAM_SIGMA = 0.02
RUN_NOISE_RUNTIME_SIGMA = 0.05

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


def _uniforms(seed: int, keys: Sequence[str]) -> np.ndarray:
    """(n, 2) uniforms in (0, 1), a pure function of (seed, key): no shared stream to keep in
    step between the simulator and the workers."""
    out = np.empty((len(keys), 2), np.uint64)
    salt = f"{int(seed)}\x1f".encode()
    for i, k in enumerate(keys):
        d = hashlib.blake2b(salt + k.encode(), digest_size=16).digest()
        out[i, 0] = int.from_bytes(d[:8], "little")
        out[i, 1] = int.from_bytes(d[8:], "little")
    return ((out >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def draw_truth(
    model: ResidualModel, seed: int, fingerprints: Sequence[str], run_ids: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Each run's true (VRAM factor, runtime factor) over the predictor's own figures.

    One systematic error per fingerprint (the recurring job), drawn from the residual model, times
    a log-normal run-to-run noise per run id. Every simulated run takes its truth from here.
    """
    if len(fingerprints) != len(run_ids):
        raise SimulationError(
            f"draw_truth needs one run id per fingerprint; got {len(fingerprints)} and "
            f"{len(run_ids)}"
        )
    uniq = list(dict.fromkeys(fingerprints))
    u_fp = _uniforms(seed, [f"fp\x1f{f}" for f in uniq])
    vram_fp = np.exp(np.interp(u_fp[:, 0], model.levels, model.vram_log))
    runtime_fp = np.exp(np.interp(u_fp[:, 1], model.levels, model.runtime_log))
    where = {f: i for i, f in enumerate(uniq)}
    codes = np.fromiter((where[f] for f in fingerprints), np.int64, len(fingerprints))
    u = _uniforms(seed, [f"run\x1f{f}\x1f{r}" for f, r in zip(fingerprints, run_ids, strict=True)])
    # Box-Muller: two independent standard normals from the two uniforms.
    radius = np.sqrt(-2.0 * np.log(u[:, 0]))
    z_vram, z_runtime = radius * np.cos(2 * np.pi * u[:, 1]), radius * np.sin(2 * np.pi * u[:, 1])
    return (
        vram_fp[codes] * np.exp(RUN_NOISE_VRAM_SIGMA * z_vram),
        runtime_fp[codes] * np.exp(RUN_NOISE_RUNTIME_SIGMA * z_runtime),
    )


def oom_fraction(seed: int, run_id: str, attempt: int) -> float:
    """Where in its run an OOM'ing attempt dies, uniform in (0, 1) of its runtime."""
    return float(_uniforms(seed, [f"oom\x1f{run_id}\x1f{int(attempt)}"])[0, 0])


def _quantiles(x: np.ndarray) -> np.ndarray:
    return np.quantile(x, np.asarray(_QUANTILE_LEVELS))


def _trimmed(x: np.ndarray, trim: float) -> np.ndarray:
    """``x`` without its outer ``trim`` share (half in each tail)."""
    if x.size == 0 or trim <= 0:
        return x
    lo, hi = np.quantile(x, [trim / 2, 1 - trim / 2])
    return x[(x >= lo) & (x <= hi)]


def fit_residuals(min_rows: int = 10, *, trim: float = TRIM_FRACTION) -> ResidualModel:
    """Measured/analytical log-ratios on real measured runs; placeholder if too few.

    Rows tagged ``confidence: low`` are left out: they are published figures with a known quirk
    (an unsharded load, a different allocator, an unstated batch), which stand for the source's
    setup rather than for what a job on our cluster would use. The outer ``trim`` share of what
    remains (half per tail, 1% by default) is then dropped, so a single odd row cannot set the
    simulated tail; what is trimmed is recorded in the provenance.

    VRAM uses every kept row with a measured peak (the analytical peak on the row's GPU type, or
    on an H100-80GB when the row's GPU is not in the catalogue: the memory model barely depends
    on the GPU). Runtime uses rows on catalogue GPUs with a measured step time or runtime.
    """
    from predictor.analytical import predict_table
    from predictor.measurements import load_measurements

    rows = load_measurements(strict=False)
    vram: list[float] = []
    runtime: list[float] = []
    n_low = 0
    for m in rows:
        if m.confidence == "low":
            n_low += 1
            continue
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
    v_kept = _trimmed(np.asarray(vram), trim)
    r_kept = _trimmed(np.asarray(runtime), trim)
    base = ResidualModel.placeholder()
    v = _quantiles(v_kept) if v_kept.size >= min_rows else base.vram_log
    r = _quantiles(r_kept) if r_kept.size >= min_rows else base.runtime_log
    provenance = {
        "regenerate": REGENERATE,
        "data": "datasets/measured/*.jsonl (non-simulated rows), predictor.analytical",
        "filter": f"confidence != 'low' ({n_low} rows dropped); outer {trim:.0%} trimmed",
        "n_vram_rows": int(v_kept.size),
        "n_vram_trimmed": len(vram) - int(v_kept.size),
        "n_runtime_rows": int(r_kept.size),
        "n_runtime_trimmed": len(runtime) - int(r_kept.size),
        "vram_source": "measured" if v_kept.size >= min_rows else PLACEHOLDER_RESIDUALS["source"],
        "runtime_source": "measured"
        if r_kept.size >= min_rows
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
