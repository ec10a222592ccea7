"""Validating a sweep: a burst of raw specs that differ only in ``id``, validated once per shape.

A batch submit is often one job repeated under many ids (an array, a benchmark, a batch
resubmitted after an outage). Validating each with pydantic was the largest part of the
client's CPU per job in ``benchmarks/bench_service.py --only throughput``. A spec's
validation reads its ``id`` in two places only:

- the field's own constraints: a ``str`` of ``min_length`` to ``max_length`` characters
  (read here from ``JobSpec.model_fields``, not copied);
- ``check_no_self_dependency``: ``depends_on`` must not list the job's own id.

No other validator, filler or check reads it (``JobSpec._check_and_fill`` and the validators
it calls); ``tests/predictor/test_spec_sweep.py`` pins the validators, so a new one fails
that test until it is checked here. A raw spec equal to an already validated one in everything
but ``id`` (value by value *and type by type*: ``8``, ``8.0`` and ``True`` are three shapes, as
``0.0`` and ``-0.0`` are two) therefore validates to that spec with its ``id`` replaced, when the
new id passes both checks. Anything else (a new shape, an id that fails a check or is not a
plain ASCII ``str``, a value the key cannot hold exactly such as NaN or a set) is validated in
full by :func:`~predictor.spec.parse_spec`, so every error is raised exactly as before.

Specs of one shape share their field values (``model_copy`` copies shallowly): they are
frozen, and nothing mutates a spec's lists or dicts in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .spec import JobSpec, parse_spec

__all__ = ["SweepParser"]

#: A raw value nested deeper than this is not keyed (validated in full); specs are shallow.
_MAX_DEPTH = 8
_ABSENT, _NONE, _STR = 0, 1, 2


class _Unkeyable(Exception):
    """A raw value the shape key cannot hold exactly."""


def _id_bounds() -> tuple[int, int]:
    lo, hi = 0, 10**9
    for m in JobSpec.model_fields["id"].metadata:
        lo = getattr(m, "min_length", None) or lo
        hi = getattr(m, "max_length", None) or hi
    return lo, hi


_ID_MIN, _ID_MAX = _id_bounds()


def _freeze(v: Any, depth: int) -> Any:
    """``v`` as a hashable key that is equal only for values of the same types and values."""
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return (t, v)
    if t is float:
        if v != v:  # NaN: equal to nothing, and repr drops its sign
            raise _Unkeyable
        return (t, repr(v))  # repr keeps -0.0 apart from 0.0
    if depth >= _MAX_DEPTH:
        raise _Unkeyable
    if t is list or t is tuple:
        return (t, tuple([_freeze(x, depth + 1) for x in v]))
    if t is dict:
        return (t, tuple([(_freeze(k, depth + 1), _freeze(x, depth + 1)) for k, x in v.items()]))
    raise _Unkeyable


def _shape_key(raw: dict[str, Any]) -> tuple[Any, ...] | None:
    """Everything of ``raw`` but its ``id``, as a key; None when a value cannot be keyed."""
    items: list[Any] = []
    try:
        for k, v in raw.items():
            if type(k) is not str:
                return None
            if k == "id":
                continue
            items.append((k, v) if type(v) is str else (k, _freeze(v, 0)))
    except _Unkeyable:
        return None
    jid = raw.get("id", _ABSENT)
    items.append(_ABSENT if jid is _ABSENT else _NONE if jid is None else _STR)
    return tuple(items)


class SweepParser:
    """``parse(raw)`` is ``parse_spec(raw)``, then each field of ``fill`` that the spec left
    unset (None) set by ``model_copy`` (as the client fills ``user``), with a validated spec
    reused for every later raw spec of the same shape. One parser per batch: the shapes it
    remembers are those of the batch."""

    def __init__(self, fill: Mapping[str, Any] | None = None) -> None:
        self._fill = dict(fill or {})
        self._done: dict[tuple[Any, ...], JobSpec] = {}

    def parse(self, raw: Mapping[str, Any]) -> JobSpec:
        key = _shape_key(raw) if type(raw) is dict else None
        spec = None if key is None else self._done.get(key)
        if spec is not None:
            if key[-1] != _STR:  # type: ignore[index]
                return spec  # no id, or id None: the same validation, the same spec
            jid = raw["id"]
            if (
                type(jid) is str
                and _ID_MIN <= len(jid) <= _ID_MAX
                and jid.isascii()
                and not (spec.depends_on and jid in spec.depends_on)
            ):
                return spec.model_copy(update={"id": jid})
        spec = parse_spec(raw)
        update = {k: v for k, v in self._fill.items() if getattr(spec, k) is None}
        if update:
            spec = spec.model_copy(update=update)
        if key is not None:
            self._done[key] = spec
        return spec
