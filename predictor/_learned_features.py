"""Features of the learned tier: a handful of physically meaningful columns per (job, GPU)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._jobarrays import FRAMEWORKS, TASKS, job_arrays
from .gpus import get_gpu
from .prediction import BREAKDOWN_KEYS, PredictionTable
from .spec import JobSpec, Task

__all__ = ["FEATURE_NAMES", "LEARNED_METRICS", "PREDICT_KIND", "feature_matrix"]

#: Metrics the learned tier corrects; ``runtime_s`` is derived from them.
LEARNED_METRICS: tuple[str, ...] = ("peak_vram_gib", "step_time_s", "ttft_s", "tpot_s")

# A handful of physically meaningful features: with a dozen sources per metric, every extra
# column is another way to memorise a source instead of learning a setup.
_FW_FAMILY: dict[str, str] = {
    "hf": "hf",
    "peft": "hf",
    "unsloth": "hf",
    "deepspeed": "hf",
    "torchtune": "torchtune",
    "vllm": "serving",
    "sglang": "serving",
    "trtllm": "trtllm",
    "megatron": "megatron",
    "fsdp": "fsdp",
    "other": "other",
}
_FW_FAMILIES: tuple[str, ...] = (
    "hf",
    "torchtune",
    "serving",
    "trtllm",
    "megatron",
    "fsdp",
    "other",
)
_KINDS: tuple[str, ...] = ("allocated", "reserved", "nvml_used", "unknown")
# The tensor components of the analytical breakdown (overhead is no tensor's).
_SHARE_KEYS: tuple[str, ...] = tuple(k for k in BREAKDOWN_KEYS if k != "overhead")
FEATURE_NAMES: tuple[str, ...] = (
    "task_inference",
    "task_full",
    "task_lora",
    "task_qlora",
    *(f"fw_{f}" for f in _FW_FAMILIES),
    *(f"kind_{k}" for k in _KINDS),
    "log_total_params_b",
    "is_moe",
    "weight_quantised",
    "fp8_compute",
    *(f"share_{k}" for k in _SHARE_KEYS),
    "log_tokens_per_gpu",
    "log_n_gpus",
    "log_tp",
    "log_hbm_bandwidth_gbps",
    "checkpointing",
    "base_traced",
)
#: Measurement kind the corrections predict for: the learned VRAM correction applies to the
#: tensor part of the peak (``peak − overhead``), which is what ``allocated`` counts.
PREDICT_KIND = "allocated"


def _monotone(metric: str) -> list[int]:
    # More tokens per GPU never need less memory, so the tensor correction may not fall with
    # them. Time ratios legitimately fall with work (fixed per-step costs amortise), so the
    # time corrections stay unconstrained.
    up = {"log_tokens_per_gpu"} if metric == "peak_vram_gib" else set()
    return [1 if f in up else 0 for f in FEATURE_NAMES]


def feature_matrix(
    specs: Sequence[JobSpec],
    table: PredictionTable,
    rows: np.ndarray,
    cols: np.ndarray,
    metric: str,
    kinds: Sequence[str] | None = None,
) -> np.ndarray:
    """Features for (job ``rows[k]``, GPU column ``cols[k]``) pairs; shape ``(k, n_features)``.

    ``kinds`` is the VRAM measurement kind per pair (training rows); predictions use
    :data:`PREDICT_KIND`.
    """
    j = job_arrays(specs)
    rows = np.asarray(rows, dtype=int)
    cols = np.asarray(cols, dtype=int)
    t = j.task[rows]
    task = [t == TASKS.index(Task.INFERENCE)]
    task.append((t == TASKS.index(Task.FULL_FINETUNE)) | (t == TASKS.index(Task.PRETRAIN)))
    task += [t == TASKS.index(Task.LORA), t == TASKS.index(Task.QLORA)]
    fam = np.array([_FW_FAMILY[FRAMEWORKS[int(k)].value] for k in j.framework[rows]])
    fw = [fam == f for f in _FW_FAMILIES]
    kind_arr = np.array(list(kinds) if kinds is not None else [PREDICT_KIND] * rows.size)
    kind = [kind_arr == k for k in _KINDS]
    peak = np.maximum(table.peak_vram_gib[rows, cols], 1e-9)
    # Memory shares explain memory errors; for time they only let trees memorise sources.
    use_shares = metric == "peak_vram_gib"
    shares = [
        table.breakdown_gib[k][rows, cols] / peak if use_shares else np.zeros(rows.size)
        for k in _SHARE_KEYS
    ]
    is_inf = t == TASKS.index(Task.INFERENCE)
    seq = np.where(is_inf, j.input_len[rows], j.seq_len[rows])
    # A decode step processes one token per sequence; everything else a whole sequence.
    tokens = j.batch[rows] * (1.0 if metric == "tpot_s" else np.maximum(seq, 1.0))
    bw = np.log([get_gpu(g).hbm_bandwidth_gbps for g in table.gpu_names])[cols]
    cols_out = [
        *task,
        *fw,
        *kind,
        np.log(j.total_params[rows] / 1e9),
        j.is_moe[rows],
        j.weight_is_quantised[rows],
        j.compute_bytes[rows] <= 1.0,
        *shares,
        np.log(np.maximum(tokens, 1.0)),
        np.log(j.n_gpus[rows]),
        np.log(j.tp[rows]),
        bw,
        j.checkpointing[rows],
        np.array([_is_traced(table.method[int(r)]) for r in rows], dtype=float),
    ]
    return np.column_stack(cols_out).astype(np.float64)


def _is_traced(method: str) -> bool:
    """Whether a base table's row came from the traced tier (its own conformal group)."""
    return method.startswith("traced")


def _traced_method(method: str) -> str:
    """``traced+learned:<ver>`` / ``traced+conformal:<ver>`` for a row on a traced base."""
    return "traced+" + method.removeprefix("analytical+")
