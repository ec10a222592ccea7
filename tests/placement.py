"""Builders for the placement core's inputs, shared by the core, policy, CLI and service tests:
a request with the same figures on every GPU type, a pool from node dicts, and an option.

Each test module used to write its own ``PlacementRequest(job_id, [upper * 0.9] * 5, ...)`` and
its own ``Pool.from_dict({"nodes": [{...}]})``; these say the same in one line, with the
module's own figures passed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from predictor.gpus import GPU_NAMES
from scheduler.core.decision import Option
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest

__all__ = ["flat_request", "node", "option", "pool_of"]

PerType = float | npt.ArrayLike


def _per_type(value: PerType) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=float), (len(GPU_NAMES),)).copy()


def flat_request(
    job_id: str,
    upper: PerType = 20.0,
    n: int = 1,
    *,
    runtime: PerType = 3600.0,
    runtime_upper: PerType | None = None,
    vram: PerType | None = None,
    **kw: Any,
) -> PlacementRequest:
    """A job asking ``upper`` GiB per GPU (a scalar: the same on every type) on ``n`` GPUs.

    The point prediction defaults to 90% of ``upper`` and the runtime's upper bound to 120% of
    ``runtime``; ``kw`` goes to :class:`PlacementRequest` (``gpu``, ``priority``, ...).
    """
    ups = _per_type(upper)
    rt = _per_type(runtime)
    return PlacementRequest(
        job_id,
        ups * 0.9 if vram is None else _per_type(vram),
        ups,
        rt,
        rt * 1.2 if runtime_upper is None else _per_type(runtime_upper),
        n_gpus=n,
        **kw,
    )


def node(name: str, gpu: str, count: int = 1, **kw: Any) -> dict[str, Any]:
    """One node of a pool dict; ``kw`` adds its other keys (``mode``, ``mig``, ``cpus``...)."""
    return {"name": name, "gpu": gpu, "count": count, **kw}


def pool_of(*nodes: dict[str, Any], **top: Any) -> Pool:
    """The pool of these nodes (:func:`node` dicts); ``top`` adds pool-level keys (``name``)."""
    return Pool.from_dict({**top, "nodes": list(nodes)})


def option(
    gpu: str = "H100-80GB", cost: float = 1.0, *, fits: bool = True, kind: str = "whole", **kw: Any
) -> Option:
    """One option of a job asking 20 GiB: on GPU 0 of node ``n0`` when it ``fits``, else
    nowhere with an "insufficient free" reason; a ``mig`` one is a 1g.10gb slice at start 0.
    ``kw`` overrides any field."""
    mig = kind == "mig"
    fields: dict[str, Any] = {
        "kind": kind,
        "gpu_type": gpu,
        "node": "n0" if fits else None,
        "gpu_indices": (0,) if fits else (),
        "mig_profile": "1g.10gb" if mig else None,
        "n_gpus": 1,
        "capacity_gib": 80.0,
        "reserved_gib": 20.0,
        "vram_gib": 17.5,
        "vram_upper_gib": 19.9,
        "runtime_s": 3600.0,
        "cost_usd": cost,
        "fits_now": fits,
        "fits_empty": True,
        "reason": "" if fits else f"insufficient free {gpu}: 1 more needed",
        "mig_start": 0 if mig else None,
    }
    return Option(**{**fields, **kw})
