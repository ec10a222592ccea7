"""The columns of a stored decision: a list per field, some of them run-length encoded.

A compact decision (``Decision.to_dict(compact=True)``, what the leader stores for every job
it places or rejects, thousands a second) keeps every option's fields as columns under
``option_columns``. Most of a pool's option classes share a GPU type, and only the chosen
option is bound to a node, so many columns repeat one value over long stretches: the GPU
type and the job's predicted VRAM change only from one GPU type to the next, and ``node``,
``gpu_indices``, ``cpus`` and the other binding fields are null but for the chosen row.

Those columns (:data:`RUN_COLUMNS`) are stored as ``{"runs": [[value, count], ...]}``: each
value repeated ``count`` times, in row order, adjacent runs never equal. Every other column is
a list with one value per option; ``kind`` always is one, and gives the number of options.
Which columns are runs is fixed by name, and the runs are maximal, so a decision's compact
form is one thing however it was built (from Options here, from the arrays on the leader's
hot path, :mod:`scheduler.core.table_columns`). Records written before runs existed hold
lists only and read as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import groupby
from typing import Any

from scheduler.exceptions import SchedulerError

__all__ = ["RUN_COLUMNS", "encode_runs", "expand_runs", "merged", "runs"]

#: Columns stored as runs: constant over the pool, per GPU type, or null but for the chosen row.
RUN_COLUMNS: tuple[str, ...] = (
    "gpu_type",
    "node",
    "gpu_indices",
    "n_gpus",
    "reserved_gib",
    "vram_gib",
    "vram_upper_gib",
    "mig_start",
    "leftover_gib",
    "cpus",
    "host_memory_gib",
    "n_nodes",
)


def runs(col: Iterable[Any]) -> list[list[Any]]:
    """``col`` as maximal runs ``[value, count]``; values are equal only with equal types
    (``1`` and ``1.0`` and ``True`` stay apart, so a column reads back as it was)."""
    items = list(col)
    return [[key[1], len(list(g))] for key, g in groupby(zip(map(type, items), items, strict=True))]


def merged(pairs: Iterable[tuple[Any, int]]) -> list[list[Any]]:
    """Runs from ``(value, count)`` pairs: empty ones dropped, equal neighbours joined (what
    :func:`runs` of the expanded column gives)."""
    out: list[list[Any]] = []
    for value, count in pairs:
        if count <= 0:
            continue
        if out and type(out[-1][0]) is type(value) and out[-1][0] == value:
            out[-1][1] += count
        else:
            out.append([value, count])
    return out


def encode_runs(cols: dict[str, list[Any]]) -> dict[str, Any]:
    """Columns of lists with :data:`RUN_COLUMNS` as runs (a new dict; ``cols`` unchanged)."""
    out: dict[str, Any] = dict(cols)
    for name in RUN_COLUMNS:
        if name in out:
            out[name] = {"runs": runs(out[name])}
    return out


def expand_runs(cols: Mapping[str, Any]) -> Mapping[str, Any]:
    """``cols`` with every runs column expanded to a list (``cols`` itself when none is).

    A runs column must add up to the rows of ``kind``, which must be a list."""
    names = [k for k, v in cols.items() if isinstance(v, Mapping)]
    if not names:
        return cols
    kind = cols.get("kind")
    if not isinstance(kind, list):
        raise SchedulerError(
            f"option_columns: run-length columns {sorted(names)} need 'kind' as a list of one "
            f"value per option (it gives their length); got {type(kind).__name__}"
        )
    out = dict(cols)
    for name in names:
        out[name] = _expanded(name, cols[name], len(kind))
    return out


def _expanded(name: str, col: Mapping[str, Any], n: int) -> list[Any]:
    pairs = col.get("runs")
    if set(col) != {"runs"} or not isinstance(pairs, list):
        raise SchedulerError(
            f"option_columns[{name!r}] must be a list or {{'runs': [[value, count], ...]}}; "
            f"got an object with keys {sorted(col)}"
        )
    total = 0
    for pair in pairs:
        ok = isinstance(pair, list) and len(pair) == 2
        count = pair[1] if ok else None
        if not ok or type(count) is not int or count <= 0:
            raise SchedulerError(
                f"option_columns[{name!r}] runs must be [value, count] pairs with a positive "
                f"whole count; got {pair!r}"
            )
        total += count
    if total != n:
        raise SchedulerError(
            f"option_columns[{name!r}] runs cover {total} rows; 'kind' has {n} (they must agree)"
        )
    out: list[Any] = []
    for value, count in pairs:
        # Each row its own copy, as a list column would have it (gpu_indices are lists).
        out.extend(list(value) if isinstance(value, list) else value for _ in range(count))
    return out
