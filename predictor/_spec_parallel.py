"""The ``max_tensor_parallel`` field: how far an OOM retry may raise a job's tensor parallelism.

A job that ran out of memory on the largest GPU it may use can often run split over more GPUs.
``max_tensor_parallel`` is the user's permission for that: the scheduler's OOM escalation
(``scheduler.core.escalation``) may requeue the job at ``tensor_parallel`` doubled (2, 4, 8, ...
times the submitted degree) up to this bound. ``n_gpus`` grows with it, so the data- and
pipeline-parallel layout stays the job's own: ``n_gpus`` = data parallel × tensor parallel ×
pipeline parallel. Unset (the default), or equal to ``tensor_parallel``, the job is never
re-split. It does not apply to ``serve`` deployments: ``snugfit plan`` picks each replica's
degree by its SLO. The job's command learns its degree from the ``{tensor_parallel_size}`` and
``{n_gpus}`` placeholders (or ``SNUGFIT_TENSOR_PARALLEL_SIZE`` / ``SNUGFIT_N_GPUS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._spec_types import Task
from .exceptions import SpecError
from .limits import MAX_GPUS, MAX_PARALLEL

if TYPE_CHECKING:
    from .spec import JobSpec

__all__ = ["check_max_tensor_parallel", "tensor_parallel_steps"]


def tensor_parallel_steps(tensor_parallel: int, n_gpus: int, max_tp: int | None) -> list[int]:
    """The degrees an OOM retry may raise ``tensor_parallel`` to, smallest first: the current
    one doubled, again and again, up to ``max_tp`` (and to what ``n_gpus`` may reach)."""
    if max_tp is None or tensor_parallel < 1:
        return []
    out: list[int] = []
    k = tensor_parallel * 2
    while k <= min(max_tp, MAX_PARALLEL) and n_gpus // tensor_parallel * k <= MAX_GPUS:
        out.append(k)
        k *= 2
    return out


def check_max_tensor_parallel(spec: JobSpec) -> None:
    """SpecError for a ``max_tensor_parallel`` that does not apply or permits nothing."""
    m, tp = spec.max_tensor_parallel, spec.tensor_parallel
    if m is None:
        return
    if spec.task is Task.SERVE:
        raise SpecError(
            f"`max_tensor_parallel` does not apply to `serve` deployments (got {m}); "
            "`snugfit plan` picks each replica's tensor parallelism by its SLO: remove it"
        )
    if m < tp:
        raise SpecError(
            f"`max_tensor_parallel` {m} is below `tensor_parallel` {tp}; set it to at least "
            f"{tp} (equal: never re-split), or remove it"
        )
    if m > tp and not tensor_parallel_steps(tp, spec.n_gpus, m):
        raise SpecError(
            f"`max_tensor_parallel` {m} permits no retry degree: an OOM retry doubles "
            f"`tensor_parallel` {tp} to {2 * tp} (with `n_gpus` {spec.n_gpus // tp * 2 * tp}, at "
            f"most {MAX_GPUS}); set it to {2 * tp} or more, or to {tp} to never re-split"
        )
