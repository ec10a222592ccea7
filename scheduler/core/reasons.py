"""Why an option lost, in words, and the compact codes a stored decision keeps instead.

The leader stores a compact decision for every placed job, thousands a second, and most of its
options' reasons are worded from the option's own figures: a costlier option "costs $X more
than chosen", a slot too small "needs X GiB > Y GiB", a busy MIG slice or shared GPU names its GPU
type (and profile). ``option_columns["reason"]`` keeps such
a reason as a code, and :func:`word_reasons` words it from the row's own columns when the
record is read (``Decision.from_dict``), so ``snugfit explain``, the dashboard and the client
read exactly the words they always did. Any other reason is stored in words.

A reason is stored as a code exactly when its row's columns word it identically
(:func:`encode_reasons`), so the compact form of a decision is one thing however it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.exceptions import SchedulerError

__all__ = [
    "REASON_COSTLIER",
    "REASON_NO_FREE_SLICE",
    "REASON_SHARED_FULL",
    "REASON_TOO_SMALL",
    "costlier_reason",
    "encode_reasons",
    "no_free_slice_reason",
    "shared_busy_reason",
    "shared_full_reason",
    "slot_name",
    "too_small_reason",
    "whole_busy_reason",
    "word_reasons",
]

#: A feasible option that lost on cost: ``costs $<its cost_usd - the chosen's> more than chosen``.
REASON_COSTLIER = 1
#: A slot smaller than the job: ``<slot>: needs <reserved_gib> GiB > <capacity_gib> GiB``.
REASON_TOO_SMALL = 2
#: A MIG slice that exists but none is free: ``insufficient free <type> MIG <profile>: 1 more
#: needed``.
REASON_NO_FREE_SLICE = 3
#: A shared GPU type whose GPUs all run their most jobs: ``shared <type>: every shared GPU is at
#: max_shared_jobs``.
REASON_SHARED_FULL = 4


def slot_name(kind: str, gpu_type: str, mig_profile: str | None) -> str:
    """A slot as a too-small reason names it: ``A100-40GB MIG 1g.5gb``, ``shared H100-80GB``."""
    if kind == "mig":
        return f"{gpu_type} MIG {mig_profile}"
    return f"shared {gpu_type}" if kind == "shared" else gpu_type


def costlier_reason(extra_usd: float) -> str:
    return f"costs ${extra_usd:.2f} more than chosen"


def too_small_reason(slot: str, need_gib: float, capacity_gib: float) -> str:
    return f"{slot}: needs {need_gib:.1f} GiB > {capacity_gib:.1f} GiB"


def no_free_slice_reason(gpu_type: str, mig_profile: str | None) -> str:
    return f"insufficient free {gpu_type} MIG {mig_profile}: 1 more needed"


def shared_full_reason(gpu_type: str) -> str:
    return f"shared {gpu_type}: every shared GPU is at max_shared_jobs"


def whole_busy_reason(gpu_type: str, more: int) -> str:
    """Too few whole GPUs of a type free in one node now (a job's reason, never coded)."""
    return f"insufficient free {gpu_type}: {more} more needed"


def shared_busy_reason(gpu_type: str, need_gib: float, free_gib: float) -> str:
    """No shared GPU of a type has the job's memory free now (never coded)."""
    return f"shared {gpu_type}: needs {need_gib:.1f} GiB > {free_gib:.1f} GiB free"


def _number(cols: Mapping[str, list[Any]], name: str, i: int) -> float:
    v = cols[name][i]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SchedulerError(
            f"option_columns row {i}: a coded reason needs a number in {name!r}; got {v!r}"
        )
    return float(v)


def _worded(cols: Mapping[str, list[Any]], i: int, code: int, chosen: int | None) -> str:
    if code == REASON_COSTLIER:
        if chosen is None or not 0 <= chosen < len(cols["reason"]):
            raise SchedulerError(
                f"option_columns row {i}: reason code {code} (costlier than chosen) needs a "
                f"chosen option; the decision has chosen={chosen!r}"
            )
        return costlier_reason(_number(cols, "cost_usd", i) - _number(cols, "cost_usd", chosen))
    if code == REASON_TOO_SMALL:
        slot = slot_name(cols["kind"][i], cols["gpu_type"][i], cols["mig_profile"][i])
        return too_small_reason(
            slot, _number(cols, "reserved_gib", i), _number(cols, "capacity_gib", i)
        )
    if code == REASON_NO_FREE_SLICE:
        return no_free_slice_reason(cols["gpu_type"][i], cols["mig_profile"][i])
    if code == REASON_SHARED_FULL:
        return shared_full_reason(cols["gpu_type"][i])
    raise SchedulerError(
        f"option_columns row {i}: unknown reason code {code!r}; expected one of "
        f"{list(_CODES)}, or the reason in words"
    )


_CODES = (REASON_COSTLIER, REASON_TOO_SMALL, REASON_NO_FREE_SLICE, REASON_SHARED_FULL)


def word_reasons(cols: Mapping[str, list[Any]], chosen: int | None) -> Mapping[str, list[Any]]:
    """``cols`` with every coded reason worded (a new dict when any was; ``cols`` unchanged).
    The columns must already be lists of one length."""
    reasons = cols.get("reason")
    if reasons is None or not any(type(r) is int for r in reasons):
        return cols
    words = [_worded(cols, i, r, chosen) if type(r) is int else r for i, r in enumerate(reasons)]
    return {**cols, "reason": words}


def encode_reasons(cols: dict[str, list[Any]], chosen: int | None) -> None:
    """Replace, in place, each worded reason that its row's columns word identically by its
    code (the decisions built from Options; the leader's hot path writes codes directly)."""
    reasons = cols["reason"]
    cost = cols["cost_usd"]
    c_cost = cost[chosen] if chosen is not None else None
    for i, r in enumerate(reasons):
        if not r or i == chosen:
            continue
        if r.startswith("costs $"):
            if (
                c_cost is not None
                and cost[i] is not None
                and r == costlier_reason(cost[i] - c_cost)
            ):
                reasons[i] = REASON_COSTLIER
        elif r.endswith(" GiB") and r == _worded(cols, i, REASON_TOO_SMALL, chosen):
            reasons[i] = REASON_TOO_SMALL
        elif r.endswith(": 1 more needed") and r == _worded(cols, i, REASON_NO_FREE_SLICE, None):
            reasons[i] = REASON_NO_FREE_SLICE
        elif r.endswith("max_shared_jobs") and r == _worded(cols, i, REASON_SHARED_FULL, None):
            reasons[i] = REASON_SHARED_FULL
