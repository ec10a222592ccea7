"""The label syntax and the node selector a job may carry (``JobSpec.node_selector``).

A node selector keeps a job to pool nodes whose labels match: per label key, the values it
accepts (Kubernetes ``nodeAffinity`` ``matchExpressions`` with ``operator: In``; a plain
``nodeSelector`` is the one-value case). Keys and values follow Kubernetes' label syntax.
The scheduler's side (pool labels, the node mask) is :mod:`scheduler.core.selector`; this module
holds the syntax both sides check, so a spec the client accepts is placeable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "LABEL_KEY_RE",
    "LABEL_VALUE_RE",
    "NodeSelector",
    "canonical_selector",
    "check_labels",
]

#: A label key: an optional DNS-style ``prefix/`` and a name of up to 63 letters, digits,
#: ``-``, ``_`` and ``.``, alphanumeric at both ends.
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)
#: A label value: up to 63 letters, digits, ``-``, ``_`` and ``.``, alphanumeric at both ends.
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")

#: A selector in canonical form: (key, accepted values) pairs sorted by key, values sorted.
NodeSelector = tuple[tuple[str, tuple[str, ...]], ...]

_EXAMPLE = '{"gpu-model": ["V100M16", "V100M32"]}'


def check_labels(labels: Mapping[str, str]) -> None:
    """A node's labels: ValueError names the first key or value outside the label syntax."""
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key):
            raise ValueError(
                f"label key {key!r} is not a label key: use letters, digits, '-', '_' and "
                "'.', alphanumeric at both ends, with an optional DNS 'prefix/'"
            )
        if not LABEL_VALUE_RE.match(value):
            raise ValueError(
                f"label {key!r}: value {value!r} is not a label value: use up to 63 "
                "letters, digits, '-', '_' and '.', alphanumeric at both ends"
            )


def canonical_selector(raw: Any, where: str = "node_selector") -> NodeSelector | None:
    """``raw`` (a mapping of label key to one value or a list of values, or None) in canonical
    form; None or an empty mapping: no selector. ValueError names the bad key or value and the
    expected form."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{where} must be a mapping of label key to accepted values, such as {_EXAMPLE}; "
            f"got {raw!r:.80}"
        )
    out: list[tuple[str, tuple[str, ...]]] = []
    for key, values in raw.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise ValueError(
                f"{where}: label key {key!r:.80} is not a label key (letters, digits, '-', '_', "
                "'.', alphanumeric at both ends, optional 'prefix/')"
            )
        vals = (values,) if isinstance(values, str) else values
        if isinstance(vals, Mapping) or not isinstance(vals, Iterable):
            raise ValueError(
                f"{where}[{key!r}]: accepted values must be a string or a list of strings; "
                f"got {values!r:.80}"
            )
        got = list(vals)
        for v in got:
            if not isinstance(v, str) or not LABEL_VALUE_RE.match(v):
                raise ValueError(
                    f"{where}[{key!r}]: value {v!r:.80} is not a label value (up to 63 letters, "
                    "digits, '-', '_', '.', alphanumeric at both ends)"
                )
        if not got:
            raise ValueError(
                f"{where}[{key!r}]: needs at least one accepted value (an empty list matches "
                "no node); drop the key to accept any node"
            )
        out.append((key, tuple(sorted(set(got)))))
    return tuple(sorted(out)) or None
