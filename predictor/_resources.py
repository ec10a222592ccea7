"""Checks on the host-resource fields of a JobSpec: ``cpus`` and ``host_memory_gib``.

Both are optional. Unset, a job takes its node's share per GPU it uses (for a MIG slice or a
shared GPU, that slot's fraction of one GPU's share), and the host memory share is raised to
the predictor's estimate where that is larger (:mod:`predictor.host_memory`). The bounds are the
ones the scheduler's request record uses, so a spec the client accepts is never refused later.
"""

from __future__ import annotations

import math
from typing import Any

from .exceptions import SpecError
from .limits import MAX_CPUS, MAX_HOST_MEMORY_GIB

__all__ = ["check_cpus", "check_host_memory_gib"]


def _number(field: str, value: Any, example: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(
            f"`{field}` must be a number; got {type(value).__name__} {value!r:.60}. "
            f"Write e.g. {field}: {example}"
        )
    try:
        x = float(value)
    except ValueError:
        raise SpecError(
            f"`{field}` must be a number; got {value!r:.60}. Write e.g. {field}: {example}"
        ) from None
    if not math.isfinite(x):
        raise SpecError(f"`{field}` must be finite; got {value!r}. Write e.g. {field}: {example}")
    return x


def check_cpus(value: Any) -> float | None:
    """``cpus`` as a float in (0, MAX_CPUS], or a SpecError naming the value and the fix."""
    x = _number("cpus", value, "16")
    if x is None:
        return None
    # CPUs are accounted in thousandths (Kubernetes millicores), so 0.5 is half a core.
    if not 0.001 <= x <= MAX_CPUS:
        raise SpecError(
            f"`cpus` must be between 0.001 and {MAX_CPUS} CPU cores; got {value!r}. "
            "Omit it to take the node's share per GPU"
        )
    return x


def check_host_memory_gib(value: Any) -> float | None:
    """``host_memory_gib`` as a float in (0, MAX_HOST_MEMORY_GIB], or a SpecError."""
    x = _number("host_memory_gib", value, "256")
    if x is None:
        return None
    if not 0.0 < x <= MAX_HOST_MEMORY_GIB:
        raise SpecError(
            f"`host_memory_gib` must be > 0 and at most {MAX_HOST_MEMORY_GIB:g} GiB; got "
            f"{value!r}. Omit it to take the node's share per GPU (or the predicted need)"
        )
    return x
