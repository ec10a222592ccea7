"""Node selectors: a job may run only on nodes whose labels match.

A pool node may carry ``labels`` (``{"gpu-model": "V100M16"}``, :class:`~scheduler.core.pool.
NodeConfig`). A :class:`~scheduler.core.requests.PlacementRequest` may carry a
``node_selector``: per label key, the values it accepts. A node matches when, for every key,
it has that label and its value is one of the accepted ones (Kubernetes ``nodeAffinity``
``requiredDuringSchedulingIgnoredDuringExecution`` with ``matchExpressions`` of ``operator:
In``; a plain ``nodeSelector`` is the one-value case).

Placement reads one boolean mask over the pool's nodes per selector (cached on the pool: a
queue of jobs with few distinct selectors costs one ``np.isin`` per key and selector). Option
enumeration (:class:`~scheduler.core.options.OptionBatch`) uses it three ways:

- per (job, class), whether some matching node can host the class on an empty pool; when none
  can, the class loses with the selector named ("no node matches node_selector gpu-model in
  {V100M16,V100M32}");
- per (job, class), whether the selector excludes some node of the class: such a class gets
  the per-node check (the same path as a job asking more than its CPU share), so "fits now"
  and the binding only consider matching nodes;
- the mask itself, which binding and the node-scoring policies AND into their candidates.

A multi-node gang spans matching nodes only; a job no larger than the type's largest node stays a
one-node job, so if no matching node is that large it is refused (named), not spread as a gang.

The syntax of keys, values and selectors is :mod:`predictor._node_selector` (what
``JobSpec.node_selector`` checks, so a spec the client accepts is placeable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from predictor._node_selector import (
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    NodeSelector,
    canonical_selector,
)
from scheduler.exceptions import PlacementError

if TYPE_CHECKING:
    from scheduler.core.pool import Pool
    from scheduler.core.requests import PlacementRequest

__all__ = [
    "LABEL_KEY_RE",
    "LABEL_VALUE_RE",
    "NodeSelector",
    "SelectorMasks",
    "gang_free",
    "node_selector",
    "selector_busy_reason",
    "selector_masks",
    "selector_nodes",
    "selector_reason",
    "selector_text",
]


def node_selector(raw: Any, where: str = "node_selector") -> NodeSelector | None:
    """``raw`` (a mapping of label key to one value or an iterable of values, or None) in
    canonical form (:func:`predictor._node_selector.canonical_selector`); None or an empty
    mapping: no selector. PlacementError names the bad key or value and the expected form."""
    try:
        return canonical_selector(raw, where)
    except ValueError as exc:
        raise PlacementError(str(exc)) from None


def selector_text(sel: NodeSelector) -> str:
    """``gpu-model in {V100M16,V100M32}`` (keys joined by ``, ``)."""
    return ", ".join(f"{k} in {{{','.join(v)}}}" for k, v in sel)


def selector_nodes(pool: Pool, sel: NodeSelector) -> np.ndarray:
    """Per node of ``pool``, whether it matches ``sel`` (read-only, cached on the pool)."""
    cache: dict[NodeSelector, np.ndarray] = pool._empty.setdefault("selector_nodes", {})
    got = cache.get(sel)
    if got is None:
        got = np.ones(len(pool.nodes), bool)
        for key, values in sel:
            got &= np.isin(_label_column(pool, key), values)
        got.flags.writeable = False
        cache[sel] = got
    return got


def _label_column(pool: Pool, key: str) -> np.ndarray:
    """Per node, its value of label ``key`` ("" where it has none: no accepted value is
    empty, so such a node never matches)."""
    cols: dict[str, np.ndarray] = pool._empty.setdefault("label_columns", {})
    col = cols.get(key)
    if col is None:
        col = np.array([dict(n.labels).get(key, "") for n in pool.nodes], dtype=object)
        cols[key] = col
    return col


@dataclass(frozen=True, slots=True)
class SelectorMasks:
    """The selector's part of a batch of jobs' options (module docstring): per job its node
    mask (None: no selector), and per (job, class) whether a matching node can host the class
    on an empty pool and whether the selector excludes some node of the class."""

    nodes: list[np.ndarray | None]
    class_ok: np.ndarray
    partial: np.ndarray
    any_selector: bool


def selector_masks(
    requests: Sequence[PlacementRequest], pool: Pool, gang: np.ndarray
) -> SelectorMasks:
    """:class:`SelectorMasks` of ``requests`` on ``pool``; ``gang`` (jobs, classes) marks
    classes where a job is a multi-node gang (any matching node of the class may take a share;
    elsewhere one matching node must hold all its GPUs)."""
    from scheduler.core.host import class_nodes
    from scheduler.core.pool import KIND_WHOLE

    n_jobs, k = len(requests), pool.n_classes
    nodes: list[np.ndarray | None] = [None] * n_jobs
    rows = [i for i, r in enumerate(requests) if r.node_selector is not None]
    if not rows:
        ones = np.broadcast_to(True, (n_jobs, k))
        return SelectorMasks(nodes, ones, np.broadcast_to(False, (n_jobs, k)), False)
    members = class_nodes(pool)
    class_ok = np.ones((n_jobs, k), bool)
    partial = np.zeros((n_jobs, k), bool)
    seen: dict[tuple[NodeSelector, int], tuple[np.ndarray, ...]] = {}
    for i in rows:
        r = requests[i]
        sel = r.node_selector
        assert sel is not None
        got = seen.get((sel, r.n_gpus))
        if got is None:
            m = selector_nodes(pool, sel)
            mine = members & m[None, :]
            # A whole-GPU option that is not a gang needs the job's GPUs on one node.
            big = (pool.node_count[None, :] >= r.n_gpus) | (pool.class_kind[:, None] != KIND_WHOLE)
            any_mine = mine.any(axis=1)
            # Other nodes of the class exist too: "fits now" needs the per-node check.
            got = (m, (mine & big).any(axis=1), any_mine, any_mine & (members & ~m).any(axis=1))
            seen[(sel, r.n_gpus)] = got
        nodes[i] = got[0]
        class_ok[i] = np.where(gang[i], got[2], got[1])
        partial[i] = got[3]
    return SelectorMasks(nodes, class_ok, partial, True)


def selector_reason(pool: Pool, c: int, request: PlacementRequest) -> str:
    """Why class ``c`` cannot run ``request`` on any node its selector accepts."""
    from scheduler.core.host import class_nodes

    sel = request.node_selector
    assert sel is not None
    m = selector_nodes(pool, sel)
    text = selector_text(sel)
    if not m.any():
        return f"no node matches node_selector {text}"
    mine = class_nodes(pool)[c] & m
    if not mine.any():
        return f"{pool.class_label(c)}: no node matches node_selector {text}"
    largest = int(pool.node_count[mine].max())
    return (
        f"{pool.class_label(c)}: needs {request.n_gpus} GPUs in one node; the largest node "
        f"matching node_selector {text} has {largest}"
    )


def selector_busy_reason(request: PlacementRequest) -> str:
    """Why an option that fits now elsewhere does not fit now on the matching nodes."""
    assert request.node_selector is not None
    return f"no node matching node_selector {selector_text(request.node_selector)} has room now"


def gang_free(node_free: np.ndarray, node_ok: np.ndarray | None) -> np.ndarray:
    """Free GPUs per node as a gang plan should see them: none off the job's selector."""
    return node_free if node_ok is None else np.where(node_ok, node_free, 0)
