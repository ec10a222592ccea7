"""The traced tier's public functions; see the package docstring."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._memory import MemoryModel
from ..analytical import VRAM_MARGIN_FRACTION, VRAM_MARGIN_GIB, AnalyticalPredictor
from ..gpus import get_gpu
from ..prediction import PredictionTable
from ..spec import DType, Framework, JobSpec
from ._build import hf_family
from .cache import TraceCache, fingerprint, library_versions
from .exceptions import TraceTimeout, TraceUnsupported

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "METHOD",
    "SUBMIT_BUDGET_S",
    "TraceOutcome",
    "TracedPredictor",
    "is_available",
    "trace_specs",
    "unsupported_reason",
    "wait_for_trace",
    "wait_for_traces",
]

METHOD = "traced"
#: How long placement waits at submit for a job's first trace (a cache hit answers at once).
SUBMIT_BUDGET_S = 15.0
#: Per-trace limit in the worker pool; a trace past it is killed and recorded as failed.
DEFAULT_TIMEOUT_S = 120.0

_SERVING = (Framework.VLLM, Framework.SGLANG, Framework.TRTLLM)


def is_available() -> bool:
    """True when torch, transformers and peft are importable (the ``[trace]`` extra)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))


def unsupported_reason(spec: JobSpec) -> str | None:
    """Why the tracer does not model this job (the analytical tier answers), or None."""
    fw = spec.framework
    if fw in _SERVING:
        return f"{fw.value} preallocates its KV cache by gpu_memory_utilization; not traced"
    if spec.compile:
        return "torch.compile fuses kernels and changes what is saved; not traced"
    if fw is Framework.DEEPSPEED:
        return "DeepSpeed's partitioned buffers and fp32 master weights are not traced"
    if fw is Framework.MEGATRON:
        return "Megatron/TransformerEngine kernels and distributed optimizer are not traced"
    if fw is Framework.UNSLOTH:
        return "Unsloth's fused Triton kernels and loss are not traced"
    if spec.compute_dtype in (DType.FP8, DType.FP4) or spec.weight_dtype in (DType.FP8, DType.FP4):
        return "fp8/fp4 compute runs TransformerEngine/ModelOpt kernels; not traced"
    if spec.activation_offload:
        return "activation offload to host memory is not traced"
    try:
        hf_family(spec.arch)
    except TraceUnsupported as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class TraceOutcome:
    """What happened to one job's trace: ``ok``, ``cached``, ``failed``, ``timeout``,
    ``unsupported``, ``unavailable`` or ``pending`` (still running after a wait budget)."""

    id: str | None
    key: str
    status: str
    reason: str = ""
    summary: dict[str, Any] | None = None
    wall_s: float = 0.0

    @property
    def traced(self) -> bool:
        return self.summary is not None


def _entry(summary: dict[str, Any] | None, status: str, reason: str = "") -> dict[str, Any]:
    return {
        "status": status,
        "reason": reason,
        "summary": summary,
        "versions": library_versions(),
    }


def _outcome_from_cache(spec: JobSpec, key: str, hit: dict[str, Any]) -> TraceOutcome:
    ok = hit.get("status") == "ok"
    return TraceOutcome(
        spec.id,
        key,
        "cached" if ok else hit.get("status", "failed"),
        hit.get("reason", ""),
        hit.get("summary") if ok else None,
    )


def _record(cache: TraceCache, key: str, fut: Future[dict[str, Any]]) -> tuple[str, str, Any]:
    try:
        summary = fut.result()
    except TraceTimeout as exc:
        cache.put(key, _entry(None, "timeout", str(exc)))
        return "timeout", str(exc), None
    except Exception as exc:
        cache.put(key, _entry(None, "failed", str(exc)))
        return "failed", str(exc), None
    cache.put(key, _entry(summary, "ok"))
    return "ok", "", summary


def _pending(
    specs: Sequence[JobSpec], cache: TraceCache, force: bool
) -> tuple[list[TraceOutcome | None], dict[str, JobSpec]]:
    out: list[TraceOutcome | None] = []
    todo: dict[str, JobSpec] = {}
    available = is_available()
    for s in specs:
        key = fingerprint(s)
        why = unsupported_reason(s)
        hit = None if force else cache.get(key)
        if why is not None:
            out.append(TraceOutcome(s.id, key, "unsupported", why))
        elif hit is not None:
            out.append(_outcome_from_cache(s, key, hit))
        elif not available:
            out.append(TraceOutcome(s.id, key, "unavailable", "install snugfit[trace]"))
        else:
            out.append(None)
            todo.setdefault(key, s)
    return out, todo


def trace_specs(
    specs: Sequence[JobSpec],
    *,
    workers: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cache: TraceCache | None = None,
    force: bool = False,
) -> list[TraceOutcome]:
    """Trace every job not yet cached (identical jobs once) and cache the results."""
    from ._pool import TracePool

    cache = cache or TraceCache()
    out, todo = _pending(specs, cache, force)
    if todo:
        with TracePool(workers=min(workers, len(todo)), timeout_s=timeout_s) as pool:
            futs = {k: pool.submit(s.to_dict()) for k, s in todo.items()}
            done = {k: _record(cache, k, f) for k, f in futs.items()}
    for i, s in enumerate(specs):
        if out[i] is None:
            key = fingerprint(s)
            status, reason, summary = done[key]
            wall = float(summary.get("wall_s", 0.0)) if summary else 0.0
            out[i] = TraceOutcome(s.id, key, status, reason, summary, wall)
    return [o for o in out if o is not None]


_shared: dict[str, Any] = {}
_shared_lock = threading.Lock()


def _shared_pool(timeout_s: float) -> Any:
    from ._pool import TracePool

    with _shared_lock:
        pool = _shared.get("pool")
        if pool is None:
            pool = _shared["pool"] = TracePool(workers=1, timeout_s=timeout_s)
        return pool


def wait_for_trace(
    spec: JobSpec,
    budget_s: float = SUBMIT_BUDGET_S,
    *,
    cache: TraceCache | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TraceOutcome:
    """:func:`wait_for_traces` for one job."""
    return wait_for_traces([spec], budget_s, cache=cache, timeout_s=timeout_s)[0]


def wait_for_traces(
    specs: Sequence[JobSpec],
    budget_s: float = SUBMIT_BUDGET_S,
    *,
    cache: TraceCache | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[TraceOutcome]:
    """Wait up to ``budget_s`` in all for the traces of ``specs``, starting those not cached.

    For the scheduler's submit path (:class:`scheduler.service.client.Client`): cache hits,
    excluded jobs and a machine without the ``[trace]`` extra answer at once; identical jobs
    are traced once, in a process-wide background worker. A trace not done when the budget
    runs out is ``pending``: it finishes in the background and lands in the cache, so the
    job's next prediction uses it. Placement then uses whatever the predictor answers.
    """
    cache = cache or TraceCache()
    out, todo = _pending(specs, cache, force=False)
    if not todo:
        return [o for o in out if o is not None]
    futs = {key: _start(key, s, cache, timeout_s) for key, s in todo.items()}
    deadline = time.monotonic() + max(0.0, budget_s)
    done: dict[str, TraceOutcome] = {}
    for key, fut in futs.items():
        spec = todo[key]
        try:
            fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            done[key] = TraceOutcome(spec.id, key, "pending", f"not done within {budget_s:g} s")
            continue
        except Exception:
            pass  # recorded by _record below (failed or timed out)
        hit = cache.get(key)
        if hit is None:  # the callback runs in the worker thread; record it here too
            status, reason, summary = _record(cache, key, fut)
            done[key] = TraceOutcome(spec.id, key, status, reason, summary)
        else:
            done[key] = _outcome_from_cache(spec, key, hit)
    result: list[TraceOutcome] = []
    for s, o in zip(specs, out, strict=True):
        if o is None:
            d = done[fingerprint(s)]
            o = replace(d, id=s.id)
        result.append(o)
    return result


def _start(key: str, spec: JobSpec, cache: TraceCache, timeout_s: float) -> Future[Any]:
    """The in-flight trace of ``key``, started in the shared worker if none is running: one
    trace per job even when several submits wait for it at once."""
    with _shared_lock:
        inflight: dict[str, Future[dict[str, Any]]] = _shared.setdefault("inflight", {})
        fut = inflight.get(key)
    if fut is not None:
        return fut
    fut = _shared_pool(timeout_s).submit(spec.to_dict())
    with _shared_lock:
        inflight[key] = fut

    def done(f: Future[dict[str, Any]]) -> None:
        _record(cache, key, f)
        with _shared_lock:
            inflight.pop(key, None)

    fut.add_done_callback(done)
    return fut


class TracedPredictor:
    """Traced peaks where a trace exists, the analytical answer elsewhere.

    ``wait=False`` (default) only reads the cache; ``wait=True`` first traces the jobs that
    have no entry (``trace_specs``). Runtimes are the analytical tier's. ``method`` is
    ``traced`` for a traced job, ``analytical`` otherwise. VRAM per GPU type: the traced
    allocated peak, plus allocator slack (modelled reserved − allocated), the GPU's CUDA
    context and, for multi-GPU jobs, NCCL buffers as ``overhead``. The upper bound uses the
    analytical tier's fixed margin until the learned tier calibrates one per base.
    """

    def __init__(
        self,
        cache: TraceCache | None = None,
        *,
        wait: bool = False,
        workers: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        analytical: Any = None,
    ) -> None:
        self.cache = cache or TraceCache()
        self.wait = wait
        self.workers = workers
        self.timeout_s = timeout_s
        self.analytical = analytical or AnalyticalPredictor()

    def summaries(self, specs: Sequence[JobSpec]) -> list[dict[str, Any] | None]:
        """The cached trace summary per job (None where there is none)."""
        if self.wait:
            outs = trace_specs(
                specs, workers=self.workers, timeout_s=self.timeout_s, cache=self.cache
            )
            return [o.summary for o in outs]
        out: list[dict[str, Any] | None] = []
        # By fingerprint, not by object: the jobs of one batch share a few setups, and a miss
        # (no trace yet) is a file-system lookup that a second job of the setup need not repeat.
        memo: dict[str, dict[str, Any] | None] = {}
        for s in specs:
            if unsupported_reason(s) is not None:
                out.append(None)
                continue
            k = fingerprint(s)
            if k not in memo:
                hit = self.cache.get(k)
                memo[k] = hit.get("summary") if hit and hit.get("status") == "ok" else None
            out.append(memo[k])
        return out

    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable:
        t = self.analytical.predict_table(specs, gpus)
        if not len(specs):
            return t
        sums = self.summaries(specs)
        if not any(s is not None for s in sums):
            return t
        mm = self.analytical.memory_model
        ctx = np.array([mm.context_gib(g) for g in t.gpu_names])
        peak, upper = t.peak_vram_gib.copy(), t.peak_vram_upper_gib.copy()
        bd = {k: v.copy() for k, v in t.breakdown_gib.items()}
        methods = list(t.method)
        for i, (spec, s) in enumerate(zip(specs, sums, strict=True)):
            if s is None:
                continue
            ovh = ctx + (s["reserved_gib"] - s["allocated_gib"]) + _nccl_gib(spec, mm)
            for k, v in s["breakdown_gib"].items():
                bd[k][i, :] = v
            bd["overhead"][i, :] = ovh
            peak[i, :] = s["allocated_gib"] + ovh
            upper[i, :] = peak[i, :] * (1.0 + VRAM_MARGIN_FRACTION) + VRAM_MARGIN_GIB
            methods[i] = METHOD
        cap = np.array([get_gpu(g).memory_gib for g in t.gpu_names])[None, :]
        return replace(
            t,
            peak_vram_gib=peak,
            peak_vram_upper_gib=upper,
            breakdown_gib=bd,
            fits=upper <= cap,
            method=tuple(methods),
        )


def _nccl_gib(spec: JobSpec, mm: MemoryModel) -> float:
    return mm.nccl_buffers_gib if spec.n_gpus > 1 else 0.0
