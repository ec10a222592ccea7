"""Checks on the workflow and identity fields of a JobSpec: ``user``, ``team``, ``depends_on``.

They change nothing in a prediction. ``user`` and ``team`` say who ran a job (accounting,
``snugfit queue --user``, metrics labels); ``depends_on`` lists job ids that must succeed
before this job is placed (Slurm's ``afterok``). Defaults: ``user`` is filled in by the client
at submit time with the submitting OS user (``getpass.getuser()``), not here, so that parsing a
job file never depends on who reads it; ``team`` stays None (shown as ``-``) unless given.
"""

from __future__ import annotations

import re
from typing import Any

from .exceptions import SpecError

__all__ = [
    "MAX_DEPENDENCIES",
    "MAX_JOB_ID_CHARS",
    "MAX_NAME_CHARS",
    "check_depends_on",
    "check_job_id",
    "check_name",
    "check_no_self_dependency",
]

#: Parents one job may wait on (a fan-in over a 1,000-element array; more waits in groups).
MAX_DEPENDENCIES = 1_000
#: Job ids are at most this long everywhere (JobSpec ``id``, records, RQ ids).
MAX_JOB_ID_CHARS = 200
#: ``user`` and ``team``: POSIX user names are at most 32 characters; e-mail-like names longer.
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+-]*")
# Whitespace and control characters in an id break the CLI's line-per-id output and shells.
_BAD_ID_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")


def check_name(field: str, value: Any) -> str | None:
    """``user`` / ``team`` as a short name, or a SpecError naming the field, value and fix."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(
            f"`{field}` must be a string; got {type(value).__name__} {value!r:.60}. "
            f'Quote it, e.g. {field}: "{value}"'
        )
    if not (0 < len(value) <= MAX_NAME_CHARS) or not _NAME.fullmatch(value):
        raise SpecError(
            f"`{field}` {value!r:.80} is not a valid name; use 1-{MAX_NAME_CHARS} characters "
            "of letters, digits and . _ @ + - (starting with a letter, digit or _)"
        )
    return value


def check_job_id(where: str, value: Any) -> str:
    """A well-formed job id (what ``id`` and each ``depends_on`` entry must be)."""
    if not isinstance(value, str):
        raise SpecError(
            f"`{where}` must be a job id string; got {type(value).__name__} {value!r:.60}. "
            'Quote it, e.g. depends_on: ["prep-0"]'
        )
    if not (0 < len(value) <= MAX_JOB_ID_CHARS):
        raise SpecError(
            f"`{where}` is {len(value)} characters; a job id has 1-{MAX_JOB_ID_CHARS} characters"
        )
    if _BAD_ID_CHAR.search(value):
        raise SpecError(
            f"`{where}` {value!r:.80} contains whitespace or a control character; job ids "
            "are single words such as 'prep-0'"
        )
    return value


def check_depends_on(value: Any) -> tuple[str, ...] | None:
    """``depends_on`` as a tuple of distinct well-formed ids, or a SpecError."""
    if value is None:
        return None
    if isinstance(value, str):
        raise SpecError(
            f"`depends_on` must be a list of job ids, not a string; got {value!r:.80}. "
            f'Write it as depends_on: ["{value}"]'
        )
    if not isinstance(value, list | tuple):
        raise SpecError(
            f"`depends_on` must be a list of job ids; got {type(value).__name__} {value!r:.60}"
        )
    if len(value) > MAX_DEPENDENCIES:
        raise SpecError(
            f"`depends_on` lists {len(value)} jobs; at most {MAX_DEPENDENCIES} are allowed. "
            "Make a fan-in job per group and depend on those"
        )
    out = [check_job_id(f"depends_on[{i}]", v) for i, v in enumerate(value)]
    seen: set[str] = set()
    for i, v in enumerate(out):
        if v in seen:
            raise SpecError(f"`depends_on[{i}]` lists {v!r} twice; list each parent once")
        seen.add(v)
    return tuple(out)


def check_no_self_dependency(job_id: str | None, depends_on: tuple[str, ...] | None) -> None:
    if job_id is not None and depends_on and job_id in depends_on:
        raise SpecError(
            f"`depends_on` lists the job's own id {job_id!r}; a job cannot wait for itself. "
            "Remove it from depends_on"
        )
