"""Checks on the execution fields of a JobSpec: ``time_limit_s``, ``env``, ``workdir``.

They change nothing in a prediction; the worker reads them. The bounds here are the ones the
worker enforces, so a spec the client accepts is never refused on the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .exceptions import SpecError

__all__ = [
    "MAX_ENV_VALUE_CHARS",
    "MAX_ENV_VARS",
    "MAX_TIME_LIMIT_S",
    "MAX_WORKDIR_CHARS",
    "RESERVED_ENV_PREFIXES",
    "check_env",
    "check_workdir",
]

#: A year, like the largest Slurm partitions' MaxTime; longer is a typo, not a job.
MAX_TIME_LIMIT_S = 366 * 24 * 3600.0
MAX_ENV_VARS = 256
MAX_ENV_VALUE_CHARS = 32 * 1024
MAX_WORKDIR_CHARS = 4096
#: Variables the worker sets for the job (devices, MPS, MIG, identity); a spec cannot set them.
RESERVED_ENV_PREFIXES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "NVIDIA_VISIBLE_DEVICES", "SNUGFIT_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_env(env: Any) -> dict[str, str] | None:
    """``env`` as a str -> str dict, or a SpecError naming the entry and the fix."""
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise SpecError(
            f"`env` must be a mapping of variable names to strings; got {type(env).__name__} "
            f"{env!r:.60}. Write e.g. env: {{HF_HOME: /data/hf}}"
        )
    if len(env) > MAX_ENV_VARS:
        raise SpecError(f"`env` has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise SpecError(
                f"`env` name {key!r:.60} is not a variable name; use letters, digits and _ "
                "(not starting with a digit, at most 128 characters)"
            )
        if key.upper().startswith(RESERVED_ENV_PREFIXES):
            raise SpecError(
                f"`env` sets {key!r}, which the worker sets for the job (its devices, MPS limits "
                f"and identity); remove it. Reserved: {', '.join(RESERVED_ENV_PREFIXES)}*"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SpecError(
                f"`env.{key}` must be a string; got {type(value).__name__} {value!r:.60}"
            )
        text = str(value)
        if "\0" in text or len(text) > MAX_ENV_VALUE_CHARS:
            raise SpecError(
                f"`env.{key}` must be at most {MAX_ENV_VALUE_CHARS} characters with no NUL byte; "
                f"got {len(text)} characters"
            )
        out[key] = text
    return out


def check_workdir(workdir: Any) -> str | None:
    """``workdir``: an absolute path on the node (the worker checks it exists there)."""
    if workdir is None:
        return None
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise SpecError(
            f"`workdir` must be an absolute path on the GPU node, e.g. /home/me/project; "
            f"got {workdir!r:.80}"
        )
    if "\0" in workdir or len(workdir) > MAX_WORKDIR_CHARS:
        raise SpecError(
            f"`workdir` must be at most {MAX_WORKDIR_CHARS} characters with no NUL byte; "
            f"got {len(workdir)} characters"
        )
    return workdir
