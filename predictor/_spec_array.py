"""Job arrays: one spec expanded over a set of indices, as Slurm's ``--array``.

Index sets are written as Slurm writes them: ``0-99``, ``0-9:2`` (a step), ``1,3,5`` and
mixes of these (``0-3,10,20-30:5``). Each element is the spec with the literal placeholder
``{index}`` replaced by the element's index in ``id``, every ``command`` argument, every
``env`` value, ``workdir`` and every ``depends_on`` entry (so ``depends_on: ["prep-{index}"]``
makes element *i* wait on ``prep-i``, Slurm's ``aftercorr``). An ``id`` without the
placeholder gets ``-{index}`` appended; a spec without an ``id`` gets a fresh base id first, so
every element has a predictable id. Other braces (the engine placeholders such as
``{gpu_memory_utilization}``) are left for the worker.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

from .exceptions import SpecError

__all__ = ["INDEX_PLACEHOLDER", "MAX_ARRAY_INDEX", "MAX_ARRAY_SIZE", "expand_array", "parse_array"]

INDEX_PLACEHOLDER = "{index}"
#: Elements in one array (Slurm's MaxArraySize defaults to 1,001; a sweep of 100k fits here).
MAX_ARRAY_SIZE = 100_000
#: Largest index (Slurm's is MaxArraySize - 1; ids stay short).
MAX_ARRAY_INDEX = 10_000_000
_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def parse_array(text: str) -> list[int]:
    """The indices of a Slurm-style array expression, in the order written, without repeats."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"--array {text!r}: give indices as 0-99, 0-9:2 (a step) or 1,3,5 (a list)")
    out: list[int] = []
    seen: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = _RANGE.fullmatch(part)
        if m is None:
            raise SpecError(
                f"--array {text!r}: {part!r} is not an index, a range a-b or a stepped range "
                "a-b:s; write e.g. 0-99, 0-9:2 or 1,3,5"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise SpecError(
                f"--array {text!r}: range {part!r} ends before it starts; use {hi}-{lo}"
            )
        if step < 1:
            raise SpecError(f"--array {text!r}: step in {part!r} must be at least 1")
        if hi > MAX_ARRAY_INDEX:
            raise SpecError(f"--array {text!r}: index {hi} is above {MAX_ARRAY_INDEX:,}")
        if len(out) + (hi - lo) // step + 1 > MAX_ARRAY_SIZE:
            raise SpecError(
                f"--array {text!r}: more than {MAX_ARRAY_SIZE:,} elements; split the array"
            )
        for i in range(lo, hi + 1, step):
            if i not in seen:
                seen.add(i)
                out.append(i)
    return out


def _sub(value: str, index: int) -> str:
    return value.replace(INDEX_PLACEHOLDER, str(index))


def expand_array(
    spec: dict[str, Any], indices: Sequence[int], *, chain: bool = False
) -> list[dict[str, Any]]:
    """The element specs (dicts, not yet validated) of ``spec`` over ``indices``.

    ``chain``: each element also depends on the one before it (after success), so the array
    runs one element at a time in index order and stops at the first failure.
    """
    if not indices:
        raise SpecError("an array needs at least one index; give e.g. --array 0-9")
    if len(indices) > MAX_ARRAY_SIZE:
        raise SpecError(f"an array has at most {MAX_ARRAY_SIZE:,} elements; got {len(indices):,}")
    if len(set(indices)) != len(indices):
        raise SpecError("array indices must be distinct")
    base = spec.get("id") or uuid.uuid4().hex[:12]
    if not isinstance(base, str):
        raise SpecError(f"`id` must be a string; got {type(base).__name__} {base!r:.60}")
    id_tmpl = base if INDEX_PLACEHOLDER in base else f"{base}-{INDEX_PLACEHOLDER}"
    out: list[dict[str, Any]] = []
    prev: str | None = None
    for i in indices:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= MAX_ARRAY_INDEX:
            raise SpecError(f"array index {i!r} must be an integer in [0, {MAX_ARRAY_INDEX:,}]")
        el = dict(spec)
        el["id"] = _sub(id_tmpl, i)
        if isinstance(spec.get("command"), list):
            el["command"] = [_sub(a, i) if isinstance(a, str) else a for a in spec["command"]]
        if isinstance(spec.get("env"), dict):
            el["env"] = {k: _sub(v, i) if isinstance(v, str) else v for k, v in spec["env"].items()}
        if isinstance(spec.get("workdir"), str):
            el["workdir"] = _sub(spec["workdir"], i)
        deps = spec.get("depends_on")
        if isinstance(deps, list | tuple):
            el["depends_on"] = [_sub(d, i) if isinstance(d, str) else d for d in deps]
        if chain and prev is not None:
            el["depends_on"] = [*(el.get("depends_on") or []), prev]
        prev = el["id"]
        out.append(el)
    return out
