"""After a CUDA OOM: the retry's reservation, its layout, and whether anything bigger exists.

The reservation grows by the shared rule (``scheduler.core.rules.requeue_reservation_gib``:
above the old reservation and above the limit the job died at, its true peak's only known
bound). A job that OOMed on a whole GPU or a MIG slice had all of that slot's memory, so its
retry must get a *bigger* slot: the floor goes past the slot's capacity, and placement
(cheapest option that fits) moves it to the next bigger option the job allows: a bigger slice,
a whole GPU, then a bigger GPU type. On a shared GPU the job had only its MPS limit, so the
grown reservation may still fit there.

A multi-node gang (:mod:`scheduler.core.gang`) follows the same rule: its ranks had whole GPUs,
so its retry needs a bigger type that holds the gang (the floor applies to every GPU of it).

When no GPU of the pool the job may use holds the grown per-GPU floor, the last step is more
tensor parallelism, if the spec permits it (``max_tensor_parallel``, see
``predictor/_spec_parallel.py``): the job is re-predicted at each permitted degree, smallest
first (``tensor_parallel`` doubled, ``n_gpus`` with it), its floor carried over in proportion to
the predictor's per-GPU peak at that degree, and the first degree some node of the pool can
hold wins. When nothing bigger exists (no degree is permitted or none fits), the job fails at
once instead of burning retries on slots that cannot hold it.

The worker (``workers/_outcome.py``) and the simulator (``scheduler/sim/simulator.py``) both
call :func:`escalate_oom`, so a simulated run follows the live rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from predictor.exceptions import PredictorError
from predictor.gpus import GPU_NAMES
from scheduler.core._classes import node_max_size
from scheduler.core.gang import gang_types
from scheduler.core.pool import MIB_PER_GIB, MODE_WHOLE, Pool
from scheduler.core.requests import TYPE_INDEX, PlacementRequest, requested_type
from scheduler.core.rules import memory_limit_gib, requeue_reservation_gib
from scheduler.exceptions import PlacementError

if TYPE_CHECKING:
    from predictor.prediction import PredictionTable
    from predictor.spec import JobSpec

__all__ = [
    "Escalation",
    "TableFn",
    "TensorParallelRetry",
    "escalate_after_oom",
    "escalate_oom",
    "largest_slot_gib",
]

# "Just past" a slot's capacity: one MiB, so a reservation that equals a capacity never fits.
_PAST_GIB = 1.0 / MIB_PER_GIB

#: The predictor the retry is re-predicted with: specs in, one table row per spec out.
TableFn = Callable[[Sequence["JobSpec"]], "PredictionTable"]


@dataclass(frozen=True, slots=True)
class TensorParallelRetry:
    """The retry at a higher tensor parallel degree: the job as the placer will see it."""

    spec: JobSpec  # the submitted spec at the new ``tensor_parallel`` and ``n_gpus``
    table: PredictionTable  # the predictor's figures for ``spec`` (one row)
    request: PlacementRequest  # the row as a request, its floor carried over from the OOM
    per_gpu_gib: float  # reservation per GPU of the cheapest option on an empty pool
    gpu_type: str  # that option's GPU type


@dataclass(frozen=True, slots=True)
class Escalation:
    reserved_gib: float  # the retry's reservation floor (per GPU, at the retry's layout)
    bigger_slot: bool  # the retry must go to a bigger slot than the one that OOMed
    possible: bool  # some slot of the pool the job may use holds it
    reason: str
    # Set when the retry runs at a higher tensor parallel degree (its new spec and request).
    tensor_parallel: TensorParallelRetry | None = None


def largest_slot_gib(
    pool: Pool, gpu: str | None = None, n_gpus: int = 1, tensor_parallel: int = 1
) -> float:
    """The most memory one GPU (whole or shared) of ``pool`` offers, of type ``gpu`` if pinned.

    MIG slices are never larger than their GPU, so whole GPUs bound them. A job of ``n_gpus``
    > 1 runs on whole GPUs of one node, or as a multi-node gang (:mod:`scheduler.core.gang`)
    on a type whose nodes are all smaller than it: only types that hold it one way count.
    """
    key = f"largest_slot_gib:{gpu}:{int(n_gpus)}:{int(tensor_parallel)}"
    cached = pool._empty.get(key)
    if cached is not None:
        return float(cached)
    types = pool.gpu_type
    mask = np.ones(types.shape, bool) if gpu is None else types == GPU_NAMES.index(gpu)
    if n_gpus > 1:
        big = (node_max_size(pool) >= n_gpus) | gang_types(pool, n_gpus, tensor_parallel)
        mask &= big[types.astype(np.int64)] & (pool.gpu_mode == MODE_WHOLE)
    out = float(pool.capacity_mib[mask].max()) / MIB_PER_GIB if mask.any() else 0.0
    pool._empty[key] = out
    return out


def escalate_after_oom(
    *,
    label: str,
    kind: str,
    reserved_gib: float,
    capacity_gib: float,
    largest_gib: float,
    tensor_parallel: int | None = None,
) -> Escalation:
    """The retry of a job that OOMed on slot ``label`` (``kind`` whole / mig / shared) at the
    same layout: a bigger slot, or not possible when no GPU of ``largest_gib`` holds it."""
    grown = requeue_reservation_gib(
        reserved_gib, memory_limit_gib(kind, reserved_gib, capacity_gib)
    )
    had_whole_slot = kind in ("whole", "mig") or (kind == "shared" and grown > capacity_gib)
    new = max(grown, capacity_gib + _PAST_GIB) if had_whole_slot else grown
    at = "" if tensor_parallel is None else f" at TP={tensor_parallel}"
    if new > largest_gib + 1e-9:
        return Escalation(
            new,
            had_whole_slot,
            False,
            f"CUDA OOM on {label}{at} ({'all of its' if had_whole_slot else 'its reserved'} "
            f"{capacity_gib if had_whole_slot else reserved_gib:.1f} GiB); it needs "
            f"{new:.2f} GiB per GPU and the largest GPU it may use here has {largest_gib:.1f} "
            "GiB: nothing bigger exists",
        )
    if had_whole_slot:
        nxt = {
            "mig": "a larger slice or a whole GPU",
            "whole": "a bigger GPU type",
            "shared": "a whole GPU or a bigger type",
        }[kind]
        return Escalation(
            new,
            True,
            True,
            f"CUDA OOM on {label}{at} with all of its {capacity_gib:.1f} GiB; requeued for a "
            f"bigger slot ({nxt}): reservation {new:.2f} GiB",
        )
    return Escalation(
        new,
        False,
        True,
        f"CUDA OOM on {label}{at}: reserved {reserved_gib:.2f} GiB; requeued with {new:.2f} GiB",
    )


def escalate_oom(
    *,
    label: str,
    kind: str,
    reserved_gib: float,
    capacity_gib: float,
    gpu_type: str,
    pool: Pool | None,
    spec: JobSpec | None = None,
    gpu: str | None = None,
    predict: TableFn | None = None,
    job_id: str = "",
    submit_time_s: float = 0.0,
    requested_gpu: str | None = None,
) -> Escalation:
    """The whole OOM rule: a bigger slot at the same layout, else (``spec`` permitting) a
    higher tensor parallel degree re-predicted with ``predict``, else failure at once.

    ``pool`` None (a worker that does not know its pool) assumes something bigger exists.
    ``gpu`` is the pin when no ``spec`` is given; ``job_id``, ``submit_time_s`` and
    ``requested_gpu`` go into the retry's request.
    """
    pin = spec.gpu if spec is not None else gpu
    n = spec.n_gpus if spec is not None else 1
    tp = spec.tensor_parallel if spec is not None else 1
    largest = math.inf if pool is None else largest_slot_gib(pool, pin, n, tp)
    esc = escalate_after_oom(
        label=label,
        kind=kind,
        reserved_gib=reserved_gib,
        capacity_gib=capacity_gib,
        largest_gib=largest,
        tensor_parallel=None if spec is None else spec.tensor_parallel,
    )
    if esc.possible or pool is None:
        return esc
    if spec is None or predict is None:
        return replace(esc, reason=esc.reason + _NO_TP_HINT)
    from predictor.spec import tensor_parallel_steps

    steps = tensor_parallel_steps(spec.tensor_parallel, spec.n_gpus, spec.max_tensor_parallel)
    if not steps and spec.max_tensor_parallel is None:
        return replace(esc, reason=esc.reason + _NO_TP_HINT)
    if not steps:
        return replace(
            esc,
            reason=f"{esc.reason} (TP={spec.tensor_parallel} is the `max_tensor_parallel` its "
            "spec permits; raise it to let a retry split the job further)",
        )
    ctx = _RetryContext(
        pool, spec, predict, gpu_type, esc.reserved_gib, job_id, submit_time_s, requested_gpu
    )
    retry, tried = ctx.first_fit(steps)
    if retry is None:
        return replace(
            esc,
            reason=f"{esc.reason}, nor at a higher tensor parallel degree up to its "
            f"`max_tensor_parallel` {spec.max_tensor_parallel}: {'; '.join(tried)}",
        )
    k, nk = retry.spec.tensor_parallel, retry.spec.n_gpus
    floor = retry.request.reserved_gib
    assert floor is not None  # _try always sets it
    return Escalation(
        floor,
        True,
        True,
        f"{esc.reason.removesuffix(': nothing bigger exists')}; requeued at TP={k}"
        f"{'' if nk == k else f', n_gpus {nk}'}: {nk} x {retry.per_gpu_gib:.1f} GiB "
        f"({retry.gpu_type}{''.join(f'; {t}' for t in tried)})",
        retry,
    )


_NO_TP_HINT = (
    " (more tensor parallelism would split it: set `max_tensor_parallel` so an OOM retry may "
    "raise `tensor_parallel`, or resubmit with a higher `tensor_parallel` and `n_gpus`)"
)


@dataclass(frozen=True, slots=True)
class _RetryContext:
    """What trying one tensor parallel degree needs (one OOM's view of the job)."""

    pool: Pool
    spec: JobSpec
    predict: TableFn
    gpu_type: str  # the type it OOMed on: the floor is carried over by its peaks there
    floor_gib: float  # the grown per-GPU floor at the current degree
    job_id: str
    submit_time_s: float
    requested_gpu: str | None

    def first_fit(self, steps: Sequence[int]) -> tuple[TensorParallelRetry | None, list[str]]:
        """The first degree of ``steps`` the pool holds, and why each earlier one did not."""
        table = self.predict([self.spec])
        now = self._per_type(table.peak_vram_gib, table.gpu_names)
        tried: list[str] = []
        for k in steps:
            got = self._try(k, now)
            if isinstance(got, TensorParallelRetry):
                return got, tried
            tried.append(got)
        return None, tried

    def _per_type(self, values: np.ndarray, names: Sequence[str]) -> np.ndarray:
        out = np.full(len(GPU_NAMES), np.nan)
        for j, name in enumerate(names):
            if name in TYPE_INDEX:
                out[TYPE_INDEX[name]] = float(values[0, j])
        return out

    def _try(self, k: int, now: np.ndarray) -> TensorParallelRetry | str:
        spec = self.spec
        nk = spec.n_gpus // spec.tensor_parallel * k
        from predictor.spec import parse_spec

        try:
            spec_k = parse_spec(spec.to_dict() | {"tensor_parallel": k, "n_gpus": nk})
            table = self.predict([spec_k])
        except PredictorError as exc:
            return f"TP={k}: {str(exc).splitlines()[0][:160]}"
        peak_k = self._per_type(table.peak_vram_gib, table.gpu_names)
        floor = self.floor_gib * _ratio(now, peak_k, TYPE_INDEX[self.gpu_type])
        try:
            req = PlacementRequest.from_table(
                spec_k,
                table,
                0,
                job_id=self.job_id or spec.id or "job",
                submit_time_s=self.submit_time_s,
                reserved_gib=floor,
            )
        except PlacementError as exc:
            return f"TP={k}: {exc}"
        req.requested_gpu = requested_type(
            req.vram_upper_gib, nk, self.requested_gpu or spec.gpu, self.pool
        )
        return self._placeable(req, spec_k, table, k, floor)

    def _placeable(
        self, req: PlacementRequest, spec_k: JobSpec, table: PredictionTable, k: int, floor: float
    ) -> TensorParallelRetry | str:
        from scheduler.core.options import option_table

        c = option_table(req, self.pool.state()).cheapest(now=False)
        if c is None:
            need = float(np.nanmin(np.maximum(req.vram_upper_gib, floor)))
            room = largest_slot_gib(self.pool, spec_k.gpu, spec_k.n_gpus, k)
            where = (
                f"no node has {spec_k.n_gpus} GPUs of a type it may use"
                if room == 0.0
                else f"the largest GPU on such a node has {room:.1f} GiB"
            )
            return f"TP={k} needs {spec_k.n_gpus} x {need:.1f} GiB and {where}"
        per_gpu = max(float(req.reservation_gib()[int(self.pool.class_type[c])]), floor)
        gtype = GPU_NAMES[int(self.pool.class_type[c])]
        return TensorParallelRetry(spec_k, table, req, per_gpu, gtype)


def _ratio(now: np.ndarray, new: np.ndarray, t: int) -> float:
    """How the per-GPU peak scales from the current degree to the new one, by the predictor:
    on the type the job OOMed on, else the largest ratio any type shows (the safe side)."""
    ok = np.isfinite(now) & np.isfinite(new) & (now > 0)
    if ok[t]:
        return float(new[t] / now[t])
    return float((new[ok] / now[ok]).max()) if ok.any() else 1.0
