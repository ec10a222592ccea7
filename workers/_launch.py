"""Building one attempt's runner: its devices, its environment, and the runner itself.

A real worker gets a :class:`workers.process.ProcessRun` of the job's ``command`` (argv,
placeholders filled with the engine values it was reserved), a ``--simulate`` worker a
:class:`workers.simulated.SimulatedRun`; either way, or the reason it cannot run.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from predictor._execution import check_env, check_workdir
from predictor.exceptions import SpecError
from predictor.history import fingerprint_dict
from predictor.limits import MAX_PARALLEL
from scheduler.core.requests import TYPE_INDEX
from scheduler.core.rules import memory_limit_gib
from scheduler.service.store.records import PlacementRecord
from workers.engines import engine_env, engine_values, fill_placeholders
from workers.environment import job_environment
from workers.process import ProcessRun
from workers.rendezvous import node_rank_of, torchrun_env
from workers.runner import Runner
from workers.simulated import SimulatedRun

if TYPE_CHECKING:
    from workers.execute import WorkerContext


class PlacementUnavailable(Exception):
    """The node cannot give the job what its placement says (a MIG slice it cannot find)."""


def _device_vars(ctx: WorkerContext, p: PlacementRecord) -> dict[str, str]:
    """The variables that tell the job which devices it has (and, shared, its MPS limits)."""
    out: dict[str, str] = {}
    rank = node_rank_of(p, ctx.node)
    # A gang's node sees only its share of the GPUs, and the rendezvous of the whole gang.
    gpus = p.gpu_indices if rank is None else rank.gpu_indices
    local = [ctx.local_index.get(g, g) for g in gpus]
    if rank is not None:
        out.update(torchrun_env(p, rank))
    if p.kind == "mig":
        mig_key = (p.gpu_indices[0], p.mig_profile or "", p.mig_start or 0)
        if ctx.mig is not None:
            from workers.mig import SliceUnavailable

            try:
                ctx.mig.acquire(*mig_key)
            except SliceUnavailable as exc:
                raise PlacementUnavailable(f"node {ctx.node}: {exc}") from None
        uuid = ctx.mig_uuids.get(mig_key)
        if uuid is None:
            # Never the parent GPU's index or UUID: that would hand the job the whole GPU.
            raise PlacementUnavailable(
                f"MIG slice {p.mig_profile}@{p.mig_start} of GPU {local[0]} not found on node "
                f"{ctx.node} (NVML lists {sorted(ctx.mig_uuids) or 'no MIG devices'}); "
                "refusing to fall back to the whole GPU. Check `nvidia-smi -L` against the pool"
            )
        # A MIG slice is addressed by its own UUID: an index would expose the whole parent GPU.
        out["CUDA_VISIBLE_DEVICES"] = uuid
        out["SNUGFIT_MIG_PROFILE"] = f"{p.mig_profile}@{p.mig_start}"
    else:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in local)
    if p.kind == "shared" and ctx.mps is not None:
        out.update(ctx.mps.client_env(local[0], p.reserved_gib, p.capacity_gib))
    elif p.kind == "shared":
        mib = int(p.reserved_gib * 1024 + 0.999)
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
    out["SNUGFIT_JOB_ID"] = p.rq_job_id
    out["SNUGFIT_ATTEMPT"] = str(p.attempt)
    return out


def _env_for(
    ctx: WorkerContext, p: PlacementRecord, spec: dict[str, Any] | None = None
) -> dict[str, str]:
    """The job's whole environment: its own ``env`` plus its devices, never the worker's."""
    spec_env = (spec or {}).get("env")
    return job_environment(spec_env if isinstance(spec_env, dict) else None, _device_vars(ctx, p))


def _limit_gib(p: PlacementRecord) -> float:
    return memory_limit_gib(p.kind, p.reserved_gib, p.capacity_gib)


def _predicted_for_slot(
    rec: dict[str, str], p: PlacementRecord, predictions: dict[str, Any]
) -> tuple[float | None, float | None]:
    """The predictor's own (peak GiB, runtime s) for this slot: the submitted prediction on its
    type, and the option's runtime with any history adjustment taken out (the option prices the
    request the leader placed, which history may have changed)."""
    # A type's entry that is not a mapping, or a peak that is not a number, reads as no
    # prediction (the record is not trusted to be what the client wrote).
    pred = predictions.get(p.gpu_type)
    peak = pred.get("peak_vram_gib") if isinstance(pred, dict) else None
    if not isinstance(peak, int | float) or isinstance(peak, bool):
        peak = None
    runtime = p.runtime_s
    try:
        t = TYPE_INDEX[p.gpu_type]
        base = json.loads(rec.get("request") or "{}").get("runtime_s") or []
        used = json.loads(rec.get("history_request") or rec.get("request") or "{}")
        own = (used.get("runtime_s") or [])[t]
        if runtime is not None and own and base[t]:
            runtime = runtime * float(base[t]) / float(own)
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        pass
    return (None if peak is None else float(peak)), runtime


def _runner_for(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    p: PlacementRecord,
    argv: Any,
    predicted: tuple[float | None, float | None],
    spec: dict[str, Any],
    limit: float,
    predictions: dict[str, Any],
) -> Runner | str:
    """The runner of this attempt, or why it cannot run."""
    if ctx.simulate:
        peak, runtime = predicted
        replica = _is_replica(spec)
        if replica:  # a serving replica runs its deployment's duration, or until stopped
            runtime = float((spec or {}).get("duration_s") or math.inf)
        return SimulatedRun(
            job_id,
            attempt,
            fingerprint=fingerprint_dict(spec),
            seed=ctx.truth_seed,
            predicted_peak_gib=float(peak or p.reserved_gib),
            predicted_runtime_s=float(runtime or 1.0),
            limit_gib=limit,
            time_scale=ctx.time_scale,
            label=f"{ctx.node} ({p.label})",
            exact=replica,
        )
    if not argv:
        return (
            "the job has no `command`, and this worker runs real commands; give the job a "
            "`command` (argv list), or run `snugfit worker --simulate` to simulate it"
        )
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "`command` must be a non-empty list of strings (argv; no shell)"
    try:
        # Checked again here: the record in Redis is not trusted to be what the client wrote.
        spec_env = check_env(spec.get("env"))
        workdir = check_workdir(spec.get("workdir"))
        # Serving engines are told the memory they were reserved (workers/engines.py).
        pred = predictions.get(p.gpu_type)
        breakdown = pred.get("breakdown_gib") if isinstance(pred, dict) else None
        told = engine_values(p.reserved_gib, p.capacity_gib, breakdown) | _layout_values(spec, p)
        # A serving replica also carries its plan's values (TP size, max-num-seqs, KV dtype,
        # quantization, ...), which take precedence: the planner sized the engine for its slot.
        told.update(p.engine or {})
        argv = [fill_placeholders(a, told) for a in argv]
        spec_env = {k: fill_placeholders(v, told) for k, v in (spec_env or {}).items()}
        worker_vars = engine_env(told, p.reserved_gib) | _device_vars(ctx, p)
        env = job_environment(spec_env, worker_vars)
    except (SpecError, PlacementUnavailable) as exc:
        return str(exc)
    local = [ctx.local_index.get(g, g) for g in p.gpu_indices]
    return ProcessRun(
        argv,
        env,
        ctx.nvml,
        local if p.kind != "shared" else [],
        workdir=workdir,
        grace_s=ctx.kill_grace_s,
    )


def _layout_values(spec: dict[str, Any], p: PlacementRecord) -> dict[str, str]:
    """``{tensor_parallel_size}`` and ``{n_gpus}``: the layout this attempt runs with, which an
    OOM retry may have raised (``max_tensor_parallel``), so the command must read it here."""
    tp = spec.get("tensor_parallel")
    ok = type(tp) is int and 1 <= tp <= MAX_PARALLEL
    n = len(p.gpu_indices) if p.kind == "whole" else 1
    return {"tensor_parallel_size": str(tp if ok else 1), "n_gpus": str(max(n, 1))}


def _is_replica(spec: dict[str, Any] | None) -> bool:
    """A serving deployment's replica (``task: serve``; see scheduler.service.deployments)."""
    return isinstance(spec, dict) and spec.get("task") == "serve"


def _release_slice(ctx: WorkerContext, p: PlacementRecord) -> None:
    """Destroy the MIG slice created for this attempt (dynamic layouts; others keep theirs)."""
    if ctx.mig is not None and p.kind == "mig":
        ctx.mig.release(p.gpu_indices[0], p.mig_profile or "", p.mig_start or 0)
