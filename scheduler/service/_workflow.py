"""The client's side of dependencies, holds and identity: who submits, and submitting a batch
so every parent is written before the jobs that wait on it.

The waiting itself happens in Redis (``store/scripts/workflow.lua``): a dependent job stays
``pending`` outside ``P:pending`` until its parents succeed, and fails with the parent named
when one fails. RQ's own ``depends_on`` does not fit: an RQ job exists only once the scheduler
has committed capacity for it, so a dependent would hold a GPU while it waits, and its
placement would be decided before its parents had run. snugfit decides placement in its own
state machine, so it holds the job *before* placement.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from predictor.spec import JobSpec
from scheduler.exceptions import ServiceError, UnknownDependencyError
from scheduler.service.store.protocol import Store

__all__ = ["check_parents_exist", "default_user", "order_by_dependencies"]

#: What ``user`` becomes when the OS cannot name the submitting user (a container without a
#: passwd entry and no $USER).
UNKNOWN_USER = "unknown"


def default_user() -> str:
    """The submitting OS user (``getpass.getuser()``: $LOGNAME, $USER, $LNAME, $USERNAME,
    then the passwd entry), or ``unknown``."""
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):  # getpass.getuser's order
        name = os.environ.get(var)
        if name:
            return _checked_user(name)
    return _passwd_user(os.getuid())


@functools.lru_cache(maxsize=8)
def _passwd_user(uid: int) -> str:
    """The passwd entry's name for ``uid`` (looked up once per process and uid: a one-job
    submit paid a passwd lookup each time)."""
    try:
        import pwd

        return _checked_user(pwd.getpwuid(uid)[0])
    except (OSError, KeyError, ImportError):
        return UNKNOWN_USER


def _checked_user(name: str) -> str:
    from predictor._spec_workflow import _NAME, MAX_NAME_CHARS

    return name if 0 < len(name) <= MAX_NAME_CHARS and _NAME.fullmatch(name) else UNKNOWN_USER


def order_by_dependencies(specs: Sequence[JobSpec]) -> list[JobSpec]:
    """``specs`` with every job after its parents that are in the batch (stable otherwise);
    ServiceError naming the jobs on a dependency cycle."""
    by_id = {s.id: s for s in specs if s.id is not None}
    if not any(s.depends_on for s in specs):
        return list(specs)
    out: list[JobSpec] = []
    done: set[str] = set()
    visiting: set[str] = set()
    for root in specs:
        if root.id in done:
            continue
        # Iterative DFS: a 100,000-element chain must not hit the recursion limit.
        stack: list[tuple[JobSpec, int]] = [(root, 0)]
        while stack:
            s, k = stack.pop()
            assert s.id is not None
            deps = [d for d in (s.depends_on or ()) if d in by_id]
            if k == 0:
                if s.id in done:
                    continue
                visiting.add(s.id)
            if k < len(deps):
                stack.append((s, k + 1))
                d = deps[k]
                if d in visiting:
                    cycle = [x.id for x, _ in stack if x.id in visiting] + [d]
                    raise ServiceError(
                        f"`depends_on` forms a cycle: {' -> '.join(map(str, cycle))}; a job "
                        "cannot wait, even indirectly, for itself. Remove one of these entries"
                    )
                if d not in done:
                    stack.append((by_id[d], 0))
                continue
            visiting.discard(s.id)
            done.add(s.id)
            out.append(s)
    return out


def check_parents_exist(store: Store, specs: Sequence[JobSpec]) -> None:
    """UnknownDependencyError, before anything is written, when a parent named in
    ``depends_on`` is neither in the batch nor in Redis."""
    in_batch = {s.id for s in specs}
    outside = sorted({d for s in specs for d in (s.depends_on or ()) if d not in in_batch})
    if not outside:
        return
    states = store.get_fields(outside, ["state"])
    missing = [d for d, (st,) in zip(outside, states, strict=True) if st is None]
    if missing:
        who = next(s.id for s in specs if set(s.depends_on or ()) & set(missing))
        shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise UnknownDependencyError(
            f"job {who!r}: `depends_on` names job {shown}, which does not exist; submit the "
            "parent first (or in the same batch), or fix the id. Nothing was submitted"
        )
