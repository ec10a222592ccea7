"""Money, energy and cold start of a deployment.

* $/hour = replicas × GPUs per replica × price per GPU-hour (a MIG slice is billed its compute
  share, as the scheduler prices it).
* $ per 1M output tokens = $/hour / (output tokens/s actually served × 3600) × 10⁶, at the
  requested rate, so over-provisioned replicas count against the option.
* Power per GPU = idle + utilisation × (TDP − idle) (the issue's model). TDP is from
  ``../shared/validation/gpu_specs.md`` via the GPU catalogue. ``IDLE_FRACTION_OF_TDP`` = 0.2 is
  an ASSUMPTION (the order of idle draw nvidia-smi shows on SXM boards), not a sourced figure.
  Utilisation = share of time a step is running × the achieved share of the bottleneck's peak
  (HBM bandwidth or FLOP/s) during a step.
* Cold start = weight bytes per GPU / ``LOAD_BANDWIDTH_GBPS`` + ``ENGINE_INIT_S``: both are
  ASSUMPTIONS (2 GB/s per GPU from local NVMe or a warm object-store cache; ~30 s of engine
  start-up, CUDA-graph capture and warm-up), configurable by callers.
"""

from __future__ import annotations

__all__ = [
    "ENGINE_INIT_S",
    "IDLE_FRACTION_OF_TDP",
    "LOAD_BANDWIDTH_GBPS",
    "cold_start_s",
    "power_w",
    "usd_per_million",
    "wh_per_million",
]

IDLE_FRACTION_OF_TDP = 0.2
LOAD_BANDWIDTH_GBPS = 2.0
ENGINE_INIT_S = 30.0


def power_w(tdp_w: float, utilisation: float, share: float = 1.0) -> float:
    """Draw of one GPU (or ``share`` of one, for a MIG slice) at ``utilisation`` in [0, 1]."""
    idle = IDLE_FRACTION_OF_TDP * tdp_w
    u = min(max(utilisation, 0.0), 1.0)
    return (idle + u * (tdp_w - idle)) * share


def usd_per_million(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else float("inf")


def wh_per_million(watts: float, tokens_per_s: float) -> float:
    return watts / 3600.0 * (1e6 / tokens_per_s) if tokens_per_s > 0 else float("inf")


def cold_start_s(weight_bytes_per_gpu: float, load_gbps: float = LOAD_BANDWIDTH_GBPS) -> float:
    return weight_bytes_per_gpu / (load_gbps * 1e9) + ENGINE_INIT_S
