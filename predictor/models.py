"""Model architectures: the numbers the predictor needs, and where they come from.

A :class:`ModelArch` holds the shape of a transformer (layers, widths, heads, experts, MLA ranks)
and derives parameter counts, KV-cache size and the list of linear layers from it with exact
integer arithmetic. Architectures come from three places, all offline:

* the shipped catalogue (``datasets/models/catalogue.json``), looked up by name or alias;
* a Hugging Face ``config.json`` (a file path or a directory holding one);
* a mapping of explicit architecture numbers (the JobSpec ``model`` object).

:func:`resolve_model` accepts any of these.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor._model_arch import _FIELDS, EXPLICIT_KEYS, LORA_TARGETS, ModelArch
from predictor._model_explicit import _from_explicit
from predictor._model_hf import _hf_cache_config, from_hf_config, load_hf_config
from predictor._paths import datasets_dir
from predictor.exceptions import SpecError, UnknownModelError

__all__ = [
    "EXPLICIT_KEYS",
    "LORA_TARGETS",
    "ModelArch",
    "catalogue",
    "catalogue_aliases",
    "from_hf_config",
    "load_hf_config",
    "resolve_model",
]

_CATALOGUE_META_KEYS = frozenset({"aliases", "params_source"})

_NOT_FOUND_HINT = (
    "Use a catalogue name (snugfit models lists them), a path to a Hugging Face config.json, "
    "or an object with explicit architecture numbers"
)


# --------------------------------------------------------------------- catalogue
def _catalogue_path() -> Path:
    return datasets_dir() / "models" / "catalogue.json"


@lru_cache(maxsize=1)
def _load_catalogue() -> tuple[dict[str, ModelArch], dict[str, str]]:
    path = _catalogue_path()
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise SpecError(f"model catalogue not found at {path}; set SNUGFIT_DATASETS") from exc
    if not isinstance(rows, list):
        raise SpecError(f"{path}: expected a JSON list of model objects")
    models: dict[str, ModelArch] = {}
    aliases: dict[str, str] = {}
    for row in rows:
        if not isinstance(row, dict) or "name" not in row:
            raise SpecError(f"{path}: every entry must be an object with a 'name'")
        unknown = sorted(set(row) - set(_FIELDS) - _CATALOGUE_META_KEYS)
        if unknown:
            raise SpecError(f"{path}: model {row['name']!r} has unknown keys {unknown}")
        arch = ModelArch(**{k: v for k, v in row.items() if k in _FIELDS})
        key = arch.name.lower()
        if key in models:
            raise SpecError(f"{path}: duplicate model name {arch.name!r}")
        models[key] = arch
        for alias in row.get("aliases", []):
            aliases[str(alias).lower()] = key
    return models, aliases


def catalogue() -> dict[str, ModelArch]:
    """The shipped model catalogue, keyed by lowercase name (loaded once, then cached)."""
    return dict(_load_catalogue()[0])


def catalogue_aliases() -> dict[str, str]:
    """Lowercase alias (Hugging Face repo id) → catalogue name."""
    return dict(_load_catalogue()[1])


# Suffixes that name a fine-tune with the base model's architecture.
_VARIANT_SUFFIX = re.compile(r"-(instruct|chat|it|hf|base)(-\d{4})?$")


def _lookup_name(value: str) -> ModelArch | None:
    models, aliases = _load_catalogue()
    key = value.strip().lower()
    candidates = [key]
    if "/" in key:
        candidates.append(key.rsplit("/", 1)[1])
    for cand in list(candidates):
        stripped = cand
        while True:
            shorter = _VARIANT_SUFFIX.sub("", stripped)
            if shorter == stripped:
                break
            stripped = shorter
            candidates.append(stripped)
    for cand in candidates:
        if cand in models:
            return models[cand]
        if cand in aliases:
            return models[aliases[cand]]
        for prefix in ("meta-",):
            if cand.startswith(prefix) and cand[len(prefix) :] in models:
                return models[cand[len(prefix) :]]
    return None


def resolve_model(value: str | os.PathLike[str] | Mapping[str, Any] | ModelArch) -> ModelArch:
    """Turn a catalogue name/alias, a config.json path or an explicit mapping into a ModelArch."""
    if isinstance(value, ModelArch):
        return value
    if isinstance(value, Mapping):
        return _from_explicit(value)
    if isinstance(value, os.PathLike):
        return load_hf_config(value)
    if not isinstance(value, str):
        raise SpecError(
            f"model must be a name, a config.json path or an object, got {type(value).__name__}"
        )
    text = value.strip()
    if not text:
        raise UnknownModelError(f"empty model name. {_NOT_FOUND_HINT}")
    path = Path(text).expanduser()
    try:
        is_config = path.is_file() or (path.is_dir() and (path / "config.json").is_file())
    except OSError:  # a name longer than the file system allows (ENAMETOOLONG) is no path
        is_config = False
    if is_config:
        return load_hf_config(path)
    found = _lookup_name(text)
    if found is not None:
        return found
    try:
        cached = _hf_cache_config(text)
    except OSError:
        cached = None
    if cached is not None:
        return load_hf_config(cached)
    if path.suffix == ".json" or text.startswith((".", "/", "~")):
        raise UnknownModelError(
            f"unknown model {text!r}: no such config.json file or directory. {_NOT_FOUND_HINT}"
        )
    models, aliases = _load_catalogue()
    key = text.lower()
    pool = list(models) + list(aliases)
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    if not close and "/" in key:
        close = difflib.get_close_matches(key.rsplit("/", 1)[1], pool, n=3, cutoff=0.6)
    suggestion = ""
    if close:
        names = list(dict.fromkeys(aliases.get(c, c) for c in close))
        suggestion = " did you mean " + " or ".join(repr(n) for n in names) + "?"
    raise UnknownModelError(f"unknown model {text!r};{suggestion} {_NOT_FOUND_HINT}")
