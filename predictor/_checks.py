"""Data checks on measured rows: against physics, against itself, against its siblings.

A row that contradicts physics or its own table would teach the runtime model something
false, so it is flagged, not fitted. Each failing row gets a ``[quirk:check-<name>]`` tag and a
reason in ``notes`` (:data:`predictor.measurements.CHECK_TAG`): it is still scored by
``snugfit eval`` but never fits an efficiency, trains a correction or calibrates a bound.

Checks (``tolerance`` = :data:`TOLERANCE`):

* ``peak-flops``: achieved FLOP/s (the minimal count: ``6·N`` per trained token, ``2·N`` per
  prefilled token, without attention) must not exceed the GPU's dense peak for the dtype.
* ``hbm-bandwidth``: a decode step reads the weights once, so TPOT ≥ weight bytes / HBM peak.
* ``runtime-lt-parts``: runtime ≥ (TTFT + (output − 1)·TPOT)·(1 − tolerance).
* ``sibling-batch``: in one source table, the same model, GPU, TP, dtype and lengths at a
  *larger* batch may not take less than ``SIBLING_FACTOR`` of the smaller batch's TTFT/TPOT.
* ``vram-floor``: a checkpointed training step holds at least its (sharded) weights and every
  layer's saved input (``layers × batch × seq_len × hidden`` in the compute dtype, per TP/PP
  shard) at once, so its peak reading, whatever it counts, is at least that: a reading below
  it did not run the stated batch and length (a dataset shorter than the stated length).
* ``paged-over-capacity``: a 32-bit paged AdamW row (predicted as ``adamw``: the states stay
  on the GPU while they fit) whose weights, gradients and states alone exceed the GPU's
  memory: bitsandbytes paged the states to host memory, so the reading is bounded by the
  GPU, not the job's need, and no JobSpec field says how much was paged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._jobarrays import job_arrays
from ._memory import GIB, MemoryModel, memory_breakdown_gib
from .gpus import get_gpu
from .measurements import CHECK_TAG, parse_measurement
from .spec import DType

__all__ = [
    "PAGED_32BIT_NOTE",
    "SIBLING_FACTOR",
    "TOLERANCE",
    "CheckFailure",
    "check_rows",
    "tag_failures",
]

TOLERANCE = 0.10
SIBLING_FACTOR = 0.5
#: Marker the converter puts in the notes of a 32-bit paged AdamW row.
PAGED_32BIT_NOTE = "32-bit paged AdamW (bitsandbytes), predicted as adamw"


@dataclass(frozen=True, slots=True)
class CheckFailure:
    id: str
    check: str
    reason: str


def _physics(rows: Sequence[Mapping[str, Any]]) -> list[CheckFailure]:
    timed = [r for r in rows if r.get("gpu") and _has_time(r)]
    if not timed:
        return []
    ms = [parse_measurement(r) for r in timed]
    j = job_arrays([m.spec for m in ms])
    weights = memory_breakdown_gib(j, ("A100-80GB",), MemoryModel())["weights"][:, 0] * GIB
    out: list[CheckFailure] = []
    for i, m in enumerate(ms):
        gpu = get_gpu(m.gpu or "")
        dtype = m.spec.compute_dtype or m.spec.weight_dtype
        peak = gpu.peak_tflops_for(dtype.value if dtype else "bf16") * 1e12
        n = float(j.flop_params[i])
        if m.step_time_s:
            tokens = float(j.batch[i] * j.seq_len[i] * j.grad_accum[i] * j.dp[i])
            coef = 4.0 if m.spec.task.is_peft else 6.0
            tflops = coef * n * tokens / m.step_time_s / m.spec.n_gpus
            if tflops > peak:
                out.append(_fail(m.id, "peak-flops", f"training at {tflops / 1e12:.0f}", peak))
        if m.ttft_s:
            tokens = float(j.batch[i] * j.input_len[i])
            tflops = 2.0 * n * tokens / m.ttft_s / m.spec.tensor_parallel
            if tflops > peak:
                out.append(_fail(m.id, "peak-flops", f"prefill at {tflops / 1e12:.0f}", peak))
        if m.tpot_s:
            floor = float(weights[i]) / (gpu.hbm_bandwidth_gbps * 1e9)
            if m.tpot_s < floor * (1.0 - TOLERANCE):
                out.append(
                    CheckFailure(
                        m.id,
                        "hbm-bandwidth",
                        f"TPOT {m.tpot_s * 1e3:.2f} ms is below reading the weights once at "
                        f"{gpu.name}'s peak HBM bandwidth ({floor * 1e3:.2f} ms)",
                    )
                )
        if m.runtime_s and m.ttft_s and m.tpot_s and m.spec.output_len:
            parts = m.ttft_s + (m.spec.output_len - 1) * m.tpot_s
            if m.runtime_s < parts * (1.0 - TOLERANCE):
                out.append(
                    CheckFailure(
                        m.id,
                        "runtime-lt-parts",
                        f"runtime {m.runtime_s:.3g} s is {m.runtime_s / parts:.2f}x of TTFT + "
                        f"(output-1)·TPOT = {parts:.3g} s (generation stopped early?)",
                    )
                )
    return out


def _fail(row_id: str, check: str, what: str, peak: float) -> CheckFailure:
    return CheckFailure(row_id, check, f"{what} TFLOP/s per GPU exceeds the {peak / 1e12:.0f} peak")


def _has_time(r: Mapping[str, Any]) -> bool:
    return any(r.get(k) for k in ("step_time_s", "ttft_s", "tpot_s", "runtime_s"))


def _siblings(rows: Sequence[Mapping[str, Any]]) -> list[CheckFailure]:
    """Larger batch, same everything else, much faster: the larger-batch row is flagged."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        s = r["spec"]
        if s.get("task") != "inference" or not r.get("gpu"):
            continue
        key = (
            r["source"].split(" | ", 1)[0],
            str(s.get("model")),
            r["gpu"],
            s.get("tensor_parallel", 1),
            s.get("weight_dtype"),
            s.get("framework"),
            s.get("input_len"),
            s.get("output_len"),
        )
        groups[key].append(r)
    out: list[CheckFailure] = []
    for members in groups.values():
        for metric in ("ttft_s", "tpot_s"):
            have = sorted(
                (r for r in members if r.get(metric)), key=lambda r: r["spec"]["batch_size"]
            )
            for k, r in enumerate(have):
                smaller = [o for o in have[:k] if o["spec"]["batch_size"] < r["spec"]["batch_size"]]
                if not smaller:
                    continue
                ref = max(smaller, key=lambda o: float(o[metric]))
                if float(r[metric]) < SIBLING_FACTOR * float(ref[metric]):
                    out.append(
                        CheckFailure(
                            r["id"],
                            "sibling-batch",
                            f"{metric} {float(r[metric]):.4g} s at batch {r['spec']['batch_size']}"
                            f" is {float(r[metric]) / float(ref[metric]):.2f}x of row {ref['id']}"
                            f" at batch {ref['spec']['batch_size']} (same table and setup)",
                        )
                    )
    return out


def _vram_floor(rows: Sequence[Mapping[str, Any]]) -> list[CheckFailure]:
    """Checkpointed training rows whose peak is below weights + saved layer inputs."""
    vram = [r for r in rows if r.get("peak_vram_gib") and r["spec"].get("task") != "inference"]
    if not vram:
        return []
    ms = [parse_measurement(r) for r in vram]
    j = job_arrays([m.spec for m in ms])
    weights = memory_breakdown_gib(j, ("A100-80GB",), MemoryModel())["weights"][:, 0]
    out: list[CheckFailure] = []
    for i, m in enumerate(ms):
        s = m.spec
        need = _paged_state_need_gib(m.spec) if PAGED_32BIT_NOTE in m.notes else 0.0
        if m.gpu_memory_gib is not None and need > m.gpu_memory_gib:
            out.append(
                CheckFailure(
                    m.id,
                    "paged-over-capacity",
                    f"weights, gradients and fp32 AdamW states need {need:.0f} GiB per GPU, "
                    f"over its {m.gpu_memory_gib:.0f} GiB: the paged states spilled to host",
                )
            )
        if not s.gradient_checkpointing or s.activation_offload or s.seq_len is None:
            continue
        a = 2.0 if s.compute_dtype in (DType.BF16, DType.FP16) else 4.0
        inputs = (
            (s.arch.n_layers / s.pipeline_parallel * s.batch_size * s.seq_len * s.arch.hidden_size)
            * a
            / s.tensor_parallel
            / GIB
        )
        floor = float(weights[i]) + inputs
        if m.peak_vram_gib is not None and m.peak_vram_gib < floor * (1.0 - TOLERANCE):
            out.append(
                CheckFailure(
                    m.id,
                    "vram-floor",
                    f"peak {m.peak_vram_gib:.1f} GiB is below the weights per GPU "
                    f"({float(weights[i]):.1f}) plus the checkpointed layer inputs at batch "
                    f"{s.batch_size} x {s.seq_len} tokens ({inputs:.1f}): the step cannot have "
                    "seen the stated length",
                )
            )
    return out


def _paged_state_need_gib(spec: Any) -> float:
    """Weights + gradients + bitsandbytes' 32-bit AdamW moments (fp32, 8 bytes) per GPU of a
    full fine-tune, each sharded as its ZeRO stage shards it."""
    if spec.task.is_peft or spec.weight_dtype is None:
        return 0.0
    n = float(spec.arch.total_params()) / (spec.tensor_parallel * spec.pipeline_parallel)
    dp, zero = spec.data_parallel, spec.zero_stage or 0
    w = spec.weight_dtype.bits / 8.0
    shard = [dp if zero >= k else 1 for k in (3, 2, 1)]
    return n * (w / shard[0] + w / shard[1] + 8.0 / shard[2]) / GIB


def check_rows(rows: Sequence[Mapping[str, Any]]) -> list[CheckFailure]:
    """Every check failure of the measurement row dicts, in row order."""
    order = {r["id"]: k for k, r in enumerate(rows)}
    found = _physics(rows) + _siblings(rows) + _vram_floor(rows)
    return sorted(found, key=lambda f: (order.get(f.id, 0), f.check))


def tag_failures(rows: list[dict[str, Any]], failures: Sequence[CheckFailure]) -> None:
    """Append ``[quirk:check-<name>] reason`` to each failing row's notes (in place)."""
    by_id: dict[str, list[CheckFailure]] = defaultdict(list)
    for f in failures:
        by_id[f.id].append(f)
    for r in rows:
        fs = by_id.get(r["id"])
        if not fs:
            continue
        tags = "; ".join(f"{CHECK_TAG}{f.check}] {f.reason}" for f in fs)
        r["notes"] = f"{r['notes']}; {tags}" if r.get("notes") else tags
