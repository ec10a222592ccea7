"""``runtime_measured.jsonl`` rows (step times, TTFT, TPOT, throughputs) as measurement rows."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ._published_fields import _dtype, _framework, _gpu, _int, _Skip
from ._published_models import _resolve_model
from .measurements import measurement_row

__all__ = ["POWER_CAP_QUIRK", "convert_runtime_row"]


def _training_task(workload: str) -> str | None:
    w = workload.lower()
    if w.startswith("pretrain"):
        return "pretrain"
    if w.startswith("full_finetune"):
        return "full_finetune"
    if w in ("lora", "qlora"):
        return w
    return None


#: The engine a source names outside the excerpt stored in the row (framework field says "not
#: stated"), keyed by the source URL, each with where it says so.
_SOURCE_ENGINE: dict[str, tuple[str, str]] = {
    "https://github.com/SemiAnalysisAI/InferenceX/issues/828": (
        "vllm",
        "engine from the issue's own sweep: 'GPU power monitoring sweep: gptoss h100 vllm "
        "TP2/4/8 x conc4-64' (issue #828, the bot's PR title for CI run 22537293745)",
    ),
}


#: GPUs run below their nominal clocks at a power cap the source does not state: no catalogue
#: GPU type or JobSpec field expresses that, so the rows are kept but never calibrate.
POWER_CAP_QUIRK = (
    "[quirk:power-cap] the source ran these GPUs power limited at a cap it does not state; "
    "the catalogue type is the GPU at its nominal TDP"
)


def _row_framework(r: Mapping[str, Any], notes: list[str]) -> str:
    stated = _SOURCE_ENGINE.get(str(r.get("source") or ""))
    if stated is not None and _framework(r.get("framework")) == "other":
        notes.append(stated[1])
        return stated[0]
    return _framework(r.get("framework"))


def _per_gpu_tokens(r: Mapping[str, Any]) -> float | None:
    metric, unit = r["metric"], str(r.get("unit") or "")
    if (metric == "tokens_per_sec_per_gpu" and "tokens/s/GPU" in unit) or (
        metric == "tokens_per_sec_per_gpu" and "per-GPU" in unit
    ):
        return float(r["value"])
    return None


def convert_runtime_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """One ``runtime_measured.jsonl`` row → a measurement row dict; raises ``_Skip``."""
    workload = str(r["workload"])
    gpu, mem = _gpu(r.get("gpu"))
    if gpu is None:
        raise _Skip(f"GPU {r.get('gpu')!r} is not a catalogue type")
    model = _resolve_model(r["model"], r.get("architecture"), r.get("params_b"))
    precision = _dtype(r.get("precision")) or "bf16"
    n_gpus = int(r.get("num_gpus") or 1)
    tp = int(r.get("tp") or 1)
    pp = int(r.get("pp") or 1)
    notes: list[str] = []
    if "power limited" in str(r.get("gpu") or "").lower():
        notes.append(POWER_CAP_QUIRK)
    task = _training_task(workload)
    fields: dict[str, Any] = {}
    spec: dict[str, Any] = {
        "id": r["id"],
        "model": model,
        "framework": _row_framework(r, notes),
        "n_gpus": n_gpus,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
    }
    if task is not None:
        fields = _training_fields(r, spec, task, precision, notes)
    else:
        fields, spec = _inference_fields(r, spec, precision, notes)
    return measurement_row(
        id=f"pub-rt-{r['id']}",
        origin="published",
        source=f"{r.get('source_id', '')} | {r['source']}",
        spec=spec,
        gpu=gpu,
        gpu_model=r.get("gpu"),
        gpu_memory_gib=mem,
        confidence={"A": "high", "B": "medium"}.get(str(r.get("reliability_tier")), "low"),
        software={"framework": r.get("framework"), "version": r.get("framework_version")},
        notes="; ".join([*notes, str(r.get("notes") or "")]).strip("; "),
        **fields,
    )


def _training_fields(
    r: Mapping[str, Any], spec: dict[str, Any], task: str, precision: str, notes: list[str]
) -> dict[str, Any]:
    """Fill a training row's spec fields; return its measured ``step_time_s``."""
    n_gpus, tp, pp = spec["n_gpus"], spec["tensor_parallel"], spec["pipeline_parallel"]
    fields: dict[str, Any] = {}
    gbs, mbs, seq = _int(r.get("global_batch_size")), _int(r.get("micro_batch_size")), None
    seq = _int(r.get("seq_len"))
    if gbs is None or seq is None:
        raise _Skip("training row without global batch size or seq_len")
    mbs = mbs or 1
    if n_gpus % (tp * pp):
        raise _Skip(f"tp×pp={tp * pp} does not divide {n_gpus} GPUs")
    dp_spec = n_gpus // (tp * pp)
    if gbs % (mbs * dp_spec):
        raise _Skip(f"global batch {gbs} is not micro batch {mbs} × data-parallel {dp_spec} × GA")
    cp = int(r.get("cp") or 1)
    if cp > 1:
        notes.append(
            f"context parallel {cp} folded into data parallel (same tokens per GPU per step)"
        )
    if metric_is(r, "step_time_s"):
        step = float(r["value"])
    elif (tps := _per_gpu_tokens(r)) is not None:
        step = gbs * seq / (tps * n_gpus)
        notes.append("step_time_s = global_batch × seq_len / (tokens/s/GPU × n_gpus)")
    else:
        raise _Skip(
            f"training metric {r['metric']!r} ({r.get('unit')}) is not a time; converting "
            "TFLOP/s or ambiguous totals needs the source's own FLOP/GPU conventions"
        )
    weight = "bf16"
    if "amp" in str(r.get("precision") or "").lower():
        weight = "fp32"
    spec.update(
        task=task,
        weight_dtype="nf4" if task == "qlora" else weight,
        compute_dtype=precision if precision in ("fp8", "fp4", "fp16") else "bf16",
        batch_size=mbs,
        gradient_accumulation=gbs // (mbs * dp_spec),
        seq_len=seq,
        steps=1,
    )
    par = f"{r.get('parallelism_notes') or ''} {r.get('framework') or ''}"
    if "checkpointing=true" in par.lower().replace(" ", ""):
        spec["gradient_checkpointing"] = True
    if dp_spec > 1 and _fsdp_on(par):
        spec["zero_stage"] = 3
    elif dp_spec > 1 and spec["framework"] == "megatron":
        # Megatron-Core's distributed optimizer shards optimizer states across DP ranks.
        spec["zero_stage"] = 1
    if task in ("lora", "qlora"):
        notes.append("LoRA rank not in the row; JobSpec default rank 16 used")
    # runtime_s would repeat step_time_s (steps=1) and double-count the row in reports.
    fields["step_time_s"] = step
    return fields


def _fsdp_on(par: str) -> bool:
    """FSDP named in the parallelism text, and not switched off: Megatron-Bridge's tables
    write ``FSDP=0`` or ``FSDP=n/a`` for runs without it (its distributed optimizer)."""
    m = re.search(r"fsdp\s*=\s*([^;,\s]+)", par, re.IGNORECASE)
    if m:
        return m.group(1).isdigit() and int(m.group(1)) > 0
    return "fsdp" in par.lower()


def metric_is(r: Mapping[str, Any], name: str) -> bool:
    return bool(r.get("metric") == name)


def _inference_fields(
    r: Mapping[str, Any], spec: dict[str, Any], precision: str, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = str(r["workload"])
    metric = str(r["metric"])
    if workload.startswith("inference_offline_max_throughput"):
        raise _Skip(
            "offline max-throughput: steady-state tokens/s over a deep queue with an unknown "
            "in-flight batch; its TTFT is queueing, so no single TTFT/TPOT expresses it"
        )
    if workload == "inference_disaggregated_serving":
        raise _Skip("disaggregated prefill/decode serving across nodes is not a JobSpec")
    in_len, out_len = r.get("input_len"), r.get("output_len")
    if not isinstance(in_len, int | float):
        raise _Skip(f"input length {in_len!r} is not a number (variable-length dataset)")
    conc = r.get("concurrency")
    batch = _int(r.get("global_batch_size")) or (_int(conc) if isinstance(conc, int) else None)
    fields: dict[str, Any] = {}
    num_requests: int | None = None
    if workload.startswith("inference_online_serving"):
        if not isinstance(conc, int) or conc > 8:
            raise _Skip(
                "online serving at high concurrency: TTFT includes queueing and prefill and "
                "decode interleave under continuous batching"
            )
        batch = conc
        tpot_ms = other_get(r, "tpot_ms") if metric != "tpot_ms" else float(r["value"])
        if tpot_ms is None and metric == "median_tpot_ms":
            tpot_ms = float(r["value"])
        if tpot_ms is None:
            raise _Skip(f"online serving row with metric {metric!r} and no TPOT")
        fields["tpot_s"] = tpot_ms / 1e3
        ttft_ms = other_get(r, "ttft_ms") or other_get(r, "mean_ttft_ms")
        if conc == 1 and ttft_ms is not None:
            fields["ttft_s"] = ttft_ms / 1e3
        notes.append(f"online serving at concurrency {conc}: mean TPOT ≈ decode step of {conc}")
    elif workload == "inference_static_batch_latency":
        if metric != "prefill_latency_ms":
            raise _Skip(f"static-batch row with metric {metric!r}")
        fields["ttft_s"] = float(r["value"]) / 1e3
        dec = other_get(r, "decode_step_latency_ms_mean")
        if dec is not None:
            fields["tpot_s"] = dec / 1e3
        e2e = other_get(r, "e2e_latency_ms_mean")
        if e2e is not None:
            fields["runtime_s"] = e2e / 1e3
    elif workload == "inference_latency_batch1":
        batch = 1
        if metric == "ttft_ms":
            fields["ttft_s"] = float(r["value"]) / 1e3
        else:
            raise _Skip(f"batch-1 latency row with metric {metric!r}")
    elif workload == "inference_static_batch_throughput":
        batch, num_requests = _static_throughput(r, batch, out_len, fields, notes)
    else:
        raise _Skip(f"inference workload {workload!r} has no single-batch TTFT/TPOT")
    if batch is None:
        raise _Skip("inference row without a batch size / concurrency")
    weight = precision
    spec.update(
        task="inference",
        weight_dtype=weight,
        batch_size=batch,
        input_len=max(1, round(float(in_len))),
        output_len=max(1, round(float(out_len))) if isinstance(out_len, int | float) else 1,
        num_requests=num_requests or batch,
    )
    if "fp8 kv" in str(r.get("precision") or "").lower():
        spec["kv_cache_dtype"] = "fp8"
    return fields, spec


def _static_throughput(
    r: Mapping[str, Any],
    batch: int | None,
    out_len: Any,
    fields: dict[str, Any],
    notes: list[str],
) -> tuple[int, int | None]:
    """One static batch's runtime (and TPOT/TTFT); returns (batch per replica, requests)."""
    metric, unit = str(r["metric"]), str(r.get("unit") or "")
    num_requests: int | None = None
    if batch is None or not isinstance(out_len, int | float):
        raise _Skip("static-batch throughput row without batch size or output length")
    if "ambiguous" in unit and int(r.get("tp") or 1) > 1:
        raise _Skip("throughput unit is ambiguous (per GPU or total) for a TP>1 run")
    if "inconsistent" in unit:
        raise _Skip("source table value is inconsistent with its own unit")
    total = float(r["value"])
    if "per gpu" in unit.lower() or metric.endswith("per_gpu"):
        total *= int(r.get("num_gpus") or 1)
    # Static batch: one batch of `batch` sequences runs prefill then `out_len` decode steps.
    runtime = batch * float(out_len) / total
    fields["runtime_s"] = runtime
    replicas = int(r.get("num_gpus") or 1) // max(int(r.get("tp") or 1) * int(r.get("pp") or 1), 1)
    if replicas > 1 and batch % replicas == 0:
        # Data-parallel replicas each run an equal share of the batch at the same time;
        # JobSpec's batch_size is one replica's.
        notes.append(f"batch {batch} split over {replicas} data-parallel replicas")
        num_requests, batch = batch, batch // replicas
    ttft_ms = other_get(r, "ttft_ms")
    if ttft_ms is not None and runtime > ttft_ms / 1e3 and out_len > 1:
        # The batch's wall time minus its prefill leaves out_len − 1 decode steps.
        fields["tpot_s"] = (runtime - ttft_ms / 1e3) / (float(out_len) - 1.0)
        fields["ttft_s"] = ttft_ms / 1e3
        notes.append(
            "runtime_s = batch × output_len / total tokens/s (exact for one static batch); "
            "tpot_s = (runtime_s − TTFT) / (output_len − 1), TTFT from the source"
        )
    else:
        notes.append(
            "runtime_s = batch × output_len / total tokens/s (exact for one static batch); "
            "no TPOT: batch / tokens/s would include amortised prefill"
        )
    return batch, num_requests


def other_get(r: Mapping[str, Any], key: str) -> float | None:
    v = (r.get("other_metrics") or {}).get(key)
    return float(v) if isinstance(v, int | float) and not math.isnan(v) else None
