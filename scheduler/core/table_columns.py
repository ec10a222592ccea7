"""A placed job's stored ``option_columns``, straight from its option table's arrays.

The leader stores one compact decision per placed job, thousands a second. This builds its
columns equal to the ones a decision built from Options stores (``Decision._columns`` of
:meth:`OptionTable.options`, reasons coded by :func:`~scheduler.core.reasons.encode_reasons`,
runs by :func:`~scheduler.core.stored.encode_runs`), without an Option per class: the runs
columns come from the pool's class layout (cached per pool) and the chosen option, and the
reasons of classes that do not fit are coded with numpy over the classes; only the reasons a
row's own columns cannot word are worded, one class at a time.
"""

from __future__ import annotations

import math
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from predictor.gpus import GPU_NAMES
from scheduler.core._host_fit import no_short
from scheduler.core.pool import KIND_MIG, KIND_NAMES, KIND_SHARED, KIND_WHOLE, MIB_PER_GIB, Pool
from scheduler.core.reasons import (
    REASON_COSTLIER,
    REASON_NO_FREE_SLICE,
    REASON_SHARED_FULL,
    REASON_TOO_SMALL,
    costlier_reason,
    no_free_slice_reason,
    shared_busy_reason,
    shared_full_reason,
    slot_name,
    whole_busy_reason,
)
from scheduler.core.stored import merged, runs

if TYPE_CHECKING:
    from scheduler.core.decision import Option
    from scheduler.core.options import OptionBatch
    from scheduler.core.table import LoserRule, OptionTable

__all__ = [
    "busy_reason",
    "empty_codes",
    "pool_columns",
    "table_columns",
    "table_columns_json",
]

# The binding fields: null (n_nodes 1, gpu_indices empty) on every row but the chosen one.
_BOUND: tuple[tuple[str, Any], ...] = (
    ("node", None),
    ("gpu_indices", []),
    ("mig_start", None),
    ("leftover_gib", None),
    ("cpus", None),
    ("host_memory_gib", None),
    ("n_nodes", 1),
)
# The list columns the chosen row's own option overrides (its reason is "", not a loser's).
_CHOSEN_ROW = ("mig_profile", "capacity_gib", "runtime_s", "cost_usd", "fits_now", "reason")
_BOUND_NAMES = frozenset(name for name, _ in _BOUND)


#: Column templates kept per pool (:func:`table_columns`); cleared when this many are held.
_MEMO_SIZE = 1024


def table_columns(
    table: OptionTable, chosen: int | None, chosen_option: Option | None, rule: LoserRule
) -> dict[str, Any]:
    """:meth:`OptionTable.columns`: the compact decision's ``option_columns``.

    A queue of same-shaped jobs asks for the same columns again and again, apart from the
    chosen option's binding: the rest is kept per pool under a key of everything it is built
    from (:func:`_memo_key`), and each answer is a fresh copy with its own binding columns.
    """
    row = chosen_option.to_dict() if chosen is not None and chosen_option is not None else None
    key = _memo_key(table, chosen, rule, row)
    if key is None:
        return _table_columns(table, chosen, row, rule)
    memo: dict[tuple[Any, ...], dict[str, Any]] = table.pool._empty.setdefault("columns_memo", {})
    tpl = memo.get(key)
    if tpl is None:
        cols = _table_columns(table, chosen, row, rule)
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = {name: _copy(v) for name, v in cols.items()}
        return cols
    cols = {name: None if name in _BOUND_NAMES else _copy(v) for name, v in tpl.items()}
    _bound_columns(cols, chosen, row, len(table))
    return cols


#: What orjson is called with wherever a stored record is written (service.store.records.dumps).
_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


def table_columns_json(
    table: OptionTable, chosen: int | None, chosen_option: Option | None, rule: LoserRule
) -> bytes:
    """``orjson.dumps(table_columns(...))``, byte for byte, from JSON fragments kept per pool
    under :func:`_memo_key`: a template hit encodes only the binding columns."""
    row = chosen_option.to_dict() if chosen is not None and chosen_option is not None else None
    key = _memo_key(table, chosen, rule, row)
    if key is None:
        return orjson.dumps(_table_columns(table, chosen, row, rule), option=_ORJSON_OPTS)
    memo: dict[tuple[Any, ...], tuple[tuple[bytes, tuple[str, ...]], ...]]
    memo = table.pool._empty.setdefault("columns_json_memo", {})
    parts = memo.get(key)
    if parts is None:
        parts = _json_template(_table_columns(table, chosen, row, rule))
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = parts
    bound: dict[str, Any] = {}
    _bound_columns(bound, chosen, row, len(table))
    out: list[bytes] = []
    for fixed, names in parts:
        out.append(fixed)
        if names:
            # A run of binding columns as one object's members: orjson writes '"name":value'
            # joined by commas, byte for byte the fragments the template leaves out.
            out.append(orjson.dumps({n: bound[n] for n in names}, option=_ORJSON_OPTS)[1:-1])
    return b"".join(out)


def _json_template(cols: dict[str, Any]) -> tuple[tuple[bytes, tuple[str, ...]], ...]:
    """``orjson.dumps(cols)`` as (fixed bytes, binding column names that follow them), in
    column order: every column but the binding ones encoded once, and consecutive binding
    columns grouped so that each group is one encode per answer."""
    parts: list[tuple[bytes, tuple[str, ...]]] = []
    fixed: list[bytes] = [b"{"]
    group: list[str] = []
    for i, (name, v) in enumerate(cols.items()):
        if name in _BOUND_NAMES:
            if not group and i:
                fixed.append(b",")  # before the group; orjson joins the group's own members
            group.append(name)
            continue
        if group:
            parts.append((b"".join(fixed), tuple(group)))
            fixed, group = [], []
        if i:
            fixed.append(b",")
        fixed += [b'"', name.encode(), b'":', orjson.dumps(v, option=_ORJSON_OPTS)]
    if group:
        parts.append((b"".join(fixed), tuple(group)))
        fixed = []
    fixed.append(b"}")
    parts.append((b"".join(fixed), ()))
    return tuple(parts)


def _copy(v: Any) -> Any:
    """A column, copied down to its scalars (a list of scalars, or ``{"runs": [[v, n]]}``)."""
    if type(v) is list:
        return list(v)
    return {"runs": [list(r) for r in v["runs"]]}


def _memo_key(
    table: OptionTable, chosen: int | None, rule: LoserRule, row: dict[str, Any] | None
) -> tuple[Any, ...] | None:
    """Everything the columns but the binding ones are built from, or None where they read
    more of the state than its per-type summaries (a CPU or memory shortfall, a gang)."""
    if table.host_short is not no_short(table.pool) or table.gang.any():
        return None
    req, now, sel, t = table.request, table.now, table.node_ok, table
    # Spelled out, not a loop over names: this runs once per placed job.
    return (
        chosen,
        rule,
        None if row is None else _chosen_row(row),
        req.n_gpus,
        req.gpu,
        req.node_selector,
        t.ask,
        t.why_excluded,
        None if sel is None else sel.tobytes(),
        req.vram_gib.tobytes(),
        req.vram_upper_gib.tobytes(),
        now.type_max_node_free.tobytes(),
        now.type_shared_free_mib.tobytes(),
        # The table's per-class arrays the columns read (the state's part is fits_now).
        t.fits_now.tobytes(),
        t.need_mib.tobytes(),
        t.cost.tobytes(),
        t.runtime.tobytes(),
        t.fits_empty.tobytes(),
        t.empty_code.tobytes(),
        t.finite.tobytes(),
        t.pinned_ok.tobytes(),
        t.allowed.tobytes(),
        t.kind_ok.tobytes(),
        t.cap_ok.tobytes(),
        t.empty_room.tobytes(),
        t.host_empty.tobytes(),
        t.sel_ok.tobytes(),
    )


_chosen_row = itemgetter(*_CHOSEN_ROW)


def _table_columns(
    table: OptionTable, chosen: int | None, row: dict[str, Any] | None, rule: LoserRule
) -> dict[str, Any]:
    """The columns, built from the table (``row``: the chosen option's dict)."""
    pool = table.pool
    k = len(table)
    req = table.request
    const = pool_columns(pool)
    n = req.n_gpus
    by_type = const["type_runs"]
    cols: dict[str, Any] = {
        "kind": list(const["kind"]),
        "gpu_type": {"runs": [list(r) for r in const["gpu_type_runs"]]},
        "node": None,
        "gpu_indices": None,
        "mig_profile": list(const["mig_profile"]),
        "n_gpus": {
            "runs": [[1, k]]
            if n == 1
            else merged([(n if w else 1, m) for w, m in const["whole_runs"]])
        },
        "capacity_gib": (table.capacity_mib / MIB_PER_GIB).tolist(),
        "reserved_gib": {"runs": runs((table.need_mib / MIB_PER_GIB).tolist())},
        "vram_gib": {"runs": _by_type(req.vram_gib.tolist(), by_type)},
        "vram_upper_gib": {"runs": _by_type(req.vram_upper_gib.tolist(), by_type)},
        "runtime_s": _finite_list(table.runtime),
        "cost_usd": _finite_list(table.cost),
        "fits_now": table.fits_now.tolist(),
        "fits_empty": table.fits_empty.tolist(),
        "reason": _reasons(table, chosen, rule),
    }
    _bound_columns(cols, chosen, row, k)
    if row is not None and chosen is not None:
        for name in _CHOSEN_ROW:
            cols[name][chosen] = row[name]
    return cols


def _bound_columns(
    cols: dict[str, Any], chosen: int | None, row: dict[str, Any] | None, k: int
) -> None:
    """The binding columns: unbound on every row but the chosen one."""
    for name, default in _BOUND:
        v = default if row is None else row[name]
        fill = [] if name == "gpu_indices" else default
        if chosen is None or (type(v) is type(default) and v == default):
            cols[name] = {"runs": [[fill, k]]}
            continue
        # Unbound on every row but the chosen one (merged() of three runs, unrolled).
        spots = [[fill, chosen]] if chosen else []
        spots.append([v, 1])
        if chosen + 1 < k:
            spots.append([[] if name == "gpu_indices" else default, k - chosen - 1])
        cols[name] = {"runs": spots}


def _by_type(values: list[float], by_type: tuple[tuple[int, int], ...]) -> list[list[Any]]:
    """The runs of a per-GPU-type column (non-finite: null) over the pool's type runs."""
    out: list[list[Any]] = []
    for t, m in by_type:
        v: float | None = values[t]
        if not math.isfinite(v):  # type: ignore[arg-type]
            v = None
        if out and out[-1][0] == v and type(out[-1][0]) is type(v):
            out[-1][1] += m
        else:
            out.append([v, m])
    return out


def empty_codes(batch: OptionBatch, is_mig: np.ndarray) -> np.ndarray:
    """Per (job, class), the start of the reason code a class that does not fit now gets,
    from what the pool alone says (the checks of :meth:`OptionTable._why` in its order, for
    the whole batch at once): too small; busy (it would fit the empty pool; only the state
    keeps it out), coded for a MIG slice and -1 for the rest (the state words it); 0 where
    the reason needs words."""
    checked = batch.finite & batch.pinned_ok & batch.allowed & batch.kind_ok
    code = np.where(checked & ~batch.cap_ok, REASON_TOO_SMALL, 0).astype(np.int8)
    busy = batch.fits_empty & ~batch.gang
    code[busy] = -1
    code[busy & is_mig] = REASON_NO_FREE_SLICE
    return code


def _reasons(table: OptionTable, chosen: int | None, rule: LoserRule) -> list[str | int]:
    """:meth:`OptionTable.loser_reason` of every class, with the reasons a row's own columns
    word kept as codes (:mod:`scheduler.core.reasons`), from the batch's
    :func:`empty_codes` and a few array operations; only the rest are worded one by one."""
    fits = table.fits_now
    code = np.where(fits, 0, table.empty_code)
    short = table.host_short
    if short is not no_short(table.pool):
        # Busy, but short of CPUs or memory on the nodes with the GPUs: worded by _why.
        code[short & (code != REASON_TOO_SMALL)] = 0
    by_cost = rule.override is None and chosen is not None and rule.by_cost
    if by_cost:
        assert chosen is not None
        extra = table.cost - table.cost[chosen]
        code[fits & (extra >= 0.005) & np.isfinite(extra)] = REASON_COSTLIER
    out: list[str | int] = code.tolist()
    for c in np.flatnonzero(code <= 0).tolist():
        if fits[c]:
            out[c] = _ranked(table, c, chosen, rule, by_cost)
        elif out[c]:
            out[c] = _busy(table, c)
        else:
            out[c] = table._why(c)
    return out


def _ranked(table: OptionTable, c: int, chosen: int | None, rule: LoserRule, by_cost: bool) -> str:
    """A class that fits now but lost, where no code says it."""
    if rule.override is not None:
        return rule.override
    if chosen is None:
        return ""
    if by_cost:
        # An infinite extra cost is worded, not coded (its row cannot word it).
        extra = float(table.cost[c]) - float(table.cost[chosen])
        if extra >= 0.005:
            return costlier_reason(extra)
    return rule.reason


def _busy(table: OptionTable, c: int) -> str | int:
    """:func:`busy_reason` of a whole or shared class, coded where its row words it."""
    pool = table.pool
    shared = int(pool.class_kind[c]) == KIND_SHARED
    if shared and table.now.type_shared_free_mib[pool.class_type[c]] < 0:
        return REASON_SHARED_FULL
    return busy_reason(table, c)


def busy_reason(table: OptionTable, c: int) -> str:
    """Why class ``c``, which would fit an emptier pool, does not fit now: too few GPUs or
    slices free, or no shared GPU with the memory (the last of :meth:`OptionTable._why`)."""
    pool = table.pool
    t = int(pool.class_type[c])
    tname = GPU_NAMES[t]
    kind = int(pool.class_kind[c])
    if kind == KIND_WHOLE:
        return whole_busy_reason(tname, table.request.n_gpus - int(table.now.type_max_node_free[t]))
    if kind == KIND_MIG:
        return no_free_slice_reason(tname, pool.class_profile[c])
    best = int(table.now.type_shared_free_mib[t])
    if best < 0:
        return shared_full_reason(tname)
    return shared_busy_reason(tname, int(table.need_mib[c]) / MIB_PER_GIB, best / MIB_PER_GIB)


def pool_columns(pool: Pool) -> dict[str, Any]:
    """What the stored columns take from the pool alone (cached on the pool)."""
    cached = pool._empty.get("table_columns")
    if cached is None:
        kinds, types = pool.class_kind.tolist(), pool.class_type.tolist()
        cached = {
            "kind": tuple(KIND_NAMES[x] for x in kinds),
            "gpu_type_runs": tuple(tuple(r) for r in runs(GPU_NAMES[t] for t in types)),
            "mig_profile": tuple(pool.class_profile),
            # (GPU type index, classes) and (whole GPU?, classes), in class order.
            "type_runs": tuple((t, len(list(g))) for t, g in groupby(types)),
            "whole_runs": tuple(
                (w, len(list(g))) for w, g in groupby(k == KIND_WHOLE for k in kinds)
            ),
            # What a too-small slot is called in its reason ("A100-40GB MIG 1g.5gb").
            "slot_name": tuple(
                slot_name(KIND_NAMES[k], GPU_NAMES[t], p)
                for k, t, p in zip(kinds, types, pool.class_profile, strict=True)
            ),
        }
        pool._empty["table_columns"] = cached
    return cached  # type: ignore[no-any-return]


def _finite_list(a: np.ndarray) -> list[float | None]:
    if np.isfinite(a).all():
        return a.tolist()  # type: ignore[no-any-return]
    return [x if math.isfinite(x) else None for x in a.tolist()]
