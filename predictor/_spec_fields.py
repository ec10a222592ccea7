"""Checks on a spec's raw input, before pydantic builds the model.

They catch what field types cannot say well: unknown fields (with a did-you-mean), a shell
string where an argv list belongs, an oversized or deeply nested ``model``, unknown dtypes in
``allowed_weight_dtypes``. Each message names the field, the value and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from ._spec_types import DType
from .exceptions import SpecError
from .limits import MAX_MODEL_NAME_CHARS, MAX_NESTING

__all__ = ["check_allowed_weight_dtypes", "check_command", "check_model", "check_raw_spec", "depth"]


def check_raw_spec(data: Any, allowed: set[str]) -> Any:
    """``data`` unchanged, or a SpecError for a non-object, an unknown field, a bad command
    or a bad model."""
    if not isinstance(data, Mapping):
        raise SpecError(f"a job spec must be a JSON/YAML object; got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            did = f"; did you mean `{hint[0]}`?" if hint else ""
            raise SpecError(
                f"unknown field `{key}` (got {data[key]!r}){did} "
                f"Allowed fields: {', '.join(sorted(allowed))}"
            )
    cmd = data.get("command")
    if isinstance(cmd, str):
        raise SpecError(
            f"`command` must be an argv list, not a shell string; got {cmd!r}. "
            f"Write it as {json.dumps(cmd.split())}"
        )
    check_command(cmd)
    check_model(data.get("model"))
    return data


def check_allowed_weight_dtypes(data: Any) -> Any:
    """``data`` unchanged, or a SpecError when ``allowed_weight_dtypes`` is not a dtype list."""
    value = data.get("allowed_weight_dtypes") if isinstance(data, Mapping) else None
    if value is None:
        return data
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise SpecError(
            f"`allowed_weight_dtypes` must be a list of dtypes; got {value!r}. "
            "Example: ['bf16', 'fp8']"
        )
    names = [d.value for d in DType]
    for item in value:
        if str(getattr(item, "value", item)) not in names:
            raise SpecError(
                f"`allowed_weight_dtypes`: unknown dtype {item!r}; use {', '.join(names)}"
            )
    return data


def check_command(cmd: Any) -> None:
    if cmd is None:
        return
    if not isinstance(cmd, list):
        raise SpecError(
            f"`command` must be a list of strings (argv, no shell); got {type(cmd).__name__} "
            f'{cmd!r:.80}. Write it as ["python", "train.py", "--config", "cfg.yaml"]'
        )
    bad = [(i, a) for i, a in enumerate(cmd) if not isinstance(a, str)]
    if bad:
        i, a = bad[0]
        raise SpecError(
            f"`command` must be a list of strings (argv); item {i} is {type(a).__name__} "
            f"{a!r:.60}. Quote every argument, e.g. {json.dumps(str(a))}"
        )


def check_model(model: Any) -> None:
    if isinstance(model, str):
        if len(model) > MAX_MODEL_NAME_CHARS:
            raise SpecError(
                f"`model` is {len(model)} characters (at most {MAX_MODEL_NAME_CHARS}); give a "
                "catalogue name such as 'llama-3.1-8b' or a config.json path"
            )
        return
    if isinstance(model, Mapping):
        if depth(model) > MAX_NESTING:
            raise SpecError(
                f"`model` is nested more than {MAX_NESTING} levels deep; an explicit model is "
                "a flat object of architecture numbers (n_layers, hidden_size, ...)"
            )
        return
    if model is not None:
        raise SpecError(
            f"`model` must be a catalogue name such as 'llama-3.1-8b', a config.json path, or "
            f"an object of architecture numbers; got {type(model).__name__} {model!r:.60}. "
            'Quote a name (`model: "12"`); `snugfit models` lists the catalogue'
        )


def depth(obj: Any, limit: int = MAX_NESTING + 1) -> int:
    """Nesting depth of dicts/lists, counted without recursion (and only up to ``limit``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > deepest:
            deepest = d
            if deepest >= limit:
                return deepest
        if isinstance(o, Mapping):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list | tuple):
            stack.extend((v, d + 1) for v in o)
    return deepest
