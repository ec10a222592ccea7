"""Convert the published validation tables into measurement rows.

``../shared/validation/vram_measured.jsonl`` and ``runtime_measured.jsonl`` were collected by
hand from papers, READMEs and benchmark tables, each in its source's own vocabulary ("FSDP full
shard", "LoRA r=8 alpha=16 on query,value", "tokens/s/GPU"). This module maps each row onto a
JobSpec plus measured values in the shared schema of :mod:`predictor.measurements`, and returns
every row it cannot express with a one-line reason, so nothing is dropped silently.

``python -m predictor._published`` regenerates ``datasets/measured/published.jsonl``. The rules
are documented in ``datasets/measured/README.md``; keep the two in step.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._checks import CheckFailure, check_rows, tag_failures
from ._paths import datasets_dir, shared_dir
from .exceptions import DataError, SpecError
from .measurements import measurement_row
from .models import catalogue, resolve_model

__all__ = [
    "Conversion",
    "SkippedRow",
    "convert_published",
    "convert_runtime_row",
    "convert_vram_row",
    "write_published",
]


@dataclass(frozen=True, slots=True)
class SkippedRow:
    id: str
    file: str
    reason: str


@dataclass(frozen=True, slots=True)
class Conversion:
    rows: list[dict[str, Any]]
    skipped: list[SkippedRow]
    #: Rows kept but flagged non-calibratable by a data check (``predictor._checks``).
    failures: list[CheckFailure] = field(default_factory=list)


class _Skip(Exception):
    """Raised inside a converter: the row cannot be expressed, for the given reason."""


# ------------------------------------------------------------------------------ models
# Names in the tables that are the same architecture as a catalogue entry under another name.
_SAME_ARCH: dict[str, tuple[str, str]] = {
    "qwq-32b": ("qwen2.5-32b", "QwQ-32B is a Qwen2.5-32B fine-tune (same config.json shape)"),
    "deepseek-r1-0528": ("deepseek-v3", "DeepSeek-R1 shares the DeepSeek-V3 architecture"),
    "deepseekv3": ("deepseek-v3", "DeepSeek-V3 under the NeMo recipe name"),
    "deepseek-v3-671b": ("deepseek-v3", "DeepSeek-V3"),
    "deepseek-v3/r1": ("deepseek-v3", "DeepSeek-V3/R1 share one architecture"),
    "llama-7b": ("llama-2-7b", "row says LLaMA 7B; Llama-2-7B has the same shape"),
    "llama-70b": ("llama-2-70b", "row says LLaMA 70B (Llama-2 per the source's methodology)"),
}

# Families whose MLP is a plain 2-matrix GELU MLP with LayerNorm (not SwiGLU/RMSNorm).
_PLAIN_MLP_FAMILIES = ("falcon", "phi-1", "phi-2", "stablelm", "gpt-j", "gpt-neox", "mpt", "bloom")

# Architectures the catalogue lacks and the rows give only partly; numbers from each model's
# Hugging Face config.json (cited per entry).
_EXTRA_ARCHS: dict[str, dict[str, Any]] = {
    "gpt-j-6b": {
        "name": "gpt-j-6b",
        "n_layers": 28,
        "hidden_size": 4096,
        "n_heads": 16,
        "n_kv_heads": 16,
        "head_dim": 256,
        "intermediate_size": 16384,
        "vocab_size": 50400,
        "params_b": 6.05,
        "gated_mlp": False,
        "norm": "layernorm",
        "attention_bias": False,
        "mlp_bias": True,
        "source": "https://huggingface.co/EleutherAI/gpt-j-6b/blob/main/config.json",
    },
    "falcon-180b": {
        "name": "falcon-180b",
        "n_layers": 80,
        "hidden_size": 14848,
        "n_heads": 232,
        "n_kv_heads": 8,
        "head_dim": 64,
        "intermediate_size": 59392,
        "vocab_size": 65024,
        "params_b": 180.0,
        "gated_mlp": False,
        "norm": "layernorm",
        "source": "https://huggingface.co/tiiuae/falcon-180B/blob/main/config.json",
    },
    "bloom-176b": {
        "name": "bloom-176b",
        "n_layers": 70,
        "hidden_size": 14336,
        "n_heads": 112,
        "n_kv_heads": 112,
        "head_dim": 128,
        "intermediate_size": 57344,
        "vocab_size": 250880,
        "tie_embeddings": True,
        "params_b": 176.0,
        "gated_mlp": False,
        "norm": "layernorm",
        "position": "alibi",
        "attention_bias": True,
        "mlp_bias": True,
        "source": "https://huggingface.co/bigscience/bloom/blob/main/config.json",
    },
}

# MPT yamls in llm-foundry pad the GPT-NeoX tokenizer to 50368.
_MPT_VOCAB = 50368


def _norm_name(raw: str) -> str:
    s = re.sub(r"\(.*?\)", "", raw).strip().lower()
    s = s.replace("_", "-").replace(" ", "-")
    s = re.sub(r"-+", "-", s).strip("-")
    s = re.sub(r"^llama(\d)", r"llama-\1", s)
    s = re.sub(r"-(instruct|chat|hf|it|v0\.1|2-node)$", "", s)
    return s


def _resolve_model(raw: str, arch: Mapping[str, Any] | None, params_b: float | None) -> Any:
    """The JobSpec ``model`` value for a table row: a catalogue name or an explicit object."""
    name = _norm_name(raw)
    cat = catalogue()
    truncated = re.search(r"truncated to (\d+) layers", raw)
    if truncated:
        base = "llama-3.1-405b" if "405b" in name else None
        if base is None:
            raise _Skip(f"truncated proxy model {raw!r} with no full base architecture")
        d = {k: v for k, v in cat[base].to_dict().items() if v is not None}
        d["n_layers"] = int(truncated.group(1))
        d["name"] = f"{base}-{d['n_layers']}l"
        d["params_b"] = None
        return {k: v for k, v in d.items() if v is not None}
    for key in (name, re.sub(r"-tokendrop|-dropless|-w/-mtp", "", name)):
        if key in _SAME_ARCH:
            return _SAME_ARCH[key][0]
        if key in _EXTRA_ARCHS:
            return dict(_EXTRA_ARCHS[key])
        try:
            found = resolve_model(key)
        except SpecError:
            continue
        return found.name
    if arch and name.startswith("mpt-") and arch.get("d_model"):
        d_model = int(arch["d_model"])
        return {
            "name": name,
            "n_layers": int(arch["n_layers"]),
            "hidden_size": d_model,
            "n_heads": int(arch["n_heads"]),
            "intermediate_size": int(arch.get("expansion_ratio", 4)) * d_model,
            "vocab_size": int(arch.get("vocab") or _MPT_VOCAB),
            "tie_embeddings": True,
            "gated_mlp": False,
            "norm": "layernorm",
            "position": "alibi",
            "params_b": params_b,
        }
    if arch:
        # vram_measured rows carry litgpt-style arch numbers.
        layers, hidden = arch.get("layers"), arch.get("hidden")
        if isinstance(layers, int) and isinstance(hidden, int) and arch.get("vocab"):
            plain = any(name.startswith(f) for f in _PLAIN_MLP_FAMILIES)
            obj: dict[str, Any] = {
                "name": name,
                "n_layers": layers,
                "hidden_size": hidden,
                "n_heads": int(arch["heads"]),
                "n_kv_heads": int(arch.get("kv_heads") or arch["heads"]),
                "intermediate_size": int(arch["intermediate"]),
                "vocab_size": int(arch["vocab"]),
                "gated_mlp": not plain,
                "params_b": params_b,
            }
            if plain:
                obj["norm"] = "layernorm"
            return {k: v for k, v in obj.items() if v is not None}
    raise _Skip(f"model {raw!r} is not in the catalogue and the row gives no full architecture")


# ------------------------------------------------------------------------------ GPUs
def _gpu(raw: str | None) -> tuple[str | None, float | None]:
    """(catalogue name or None, memory GiB or None) from a free-text GPU description."""
    if not raw:
        return None, None
    s = raw.upper()
    mem_match = re.search(r"(\d{2,3})\s*GB", s)
    mem = float(mem_match.group(1)) if mem_match else None
    if "A100" in s:
        if "40GB" in s.replace(" ", "") or "(40GB)" in s:
            return "A100-40GB", 40.0
        if "80GB" in s.replace(" ", ""):
            return "A100-80GB", 80.0
        return None, mem
    if "H100" in s and "PCIE" not in s and "NVL" not in s:
        return "H100-80GB", 80.0
    if "H200" in s:
        return "H200-141GB", 141.0
    if "B200" in s:
        return "B200-180GB", 180.0
    return None, mem


# ------------------------------------------------------------------------------ fields
def _dtype(raw: str | None) -> str | None:
    if not raw:
        return None
    s = raw.lower()
    for key, val in (
        ("nvfp4", "fp4"),
        ("mxfp4", "fp4"),
        ("fp4", "fp4"),
        ("nf4", "nf4"),
        ("mxfp8", "fp8"),
        ("fp8", "fp8"),
        ("int8", "int8"),
        ("int4", "int4"),
        ("bf16", "bf16"),
        ("fp16", "fp16"),
        ("fp32", "fp32"),
    ):
        if key in s:
            return val
    return None


def _framework(raw: str | None) -> str:
    s = (raw or "").lower()
    for key, val in (
        ("tensorrt", "trtllm"),
        ("nim", "trtllm"),
        ("vllm", "vllm"),
        ("sglang", "sglang"),
        ("torchtune", "torchtune"),
        ("deepspeed", "deepspeed"),
        ("megatron", "megatron"),
        ("nemo", "megatron"),
        ("llama-recipes", "fsdp"),
        ("llm-foundry", "fsdp"),
        ("torchtitan", "fsdp"),
        ("unsloth", "hf"),
        ("peft", "peft"),
        ("transformers", "hf"),
    ):
        if key in s:
            return val
    return "other"


def _optimizer(raw: str | None) -> str:
    s = (raw or "").lower().replace(" ", "")
    if "paged" in s and "8bit" in s:
        return "paged_adamw_8bit"
    if "8bit" in s:
        return "adamw_8bit"
    if "adafactor" in s:
        return "adafactor"
    if "sgd" in s:
        return "sgd"
    # 32-bit paged AdamW keeps fp32 states on the GPU until memory runs short.
    return "adamw"


def _lora(raw: str | None) -> tuple[int | None, str]:
    s = (raw or "").lower()
    m = re.search(r"\br\s*=\s*(\d+)", s)
    rank = int(m.group(1)) if m else None
    if "all-linear" in s or "mlp" in s or "gate" in s or "all (" in s:
        target = "all_linear"
    elif re.search(r"q,\s*k,\s*v", s):
        target = "attention"
    else:
        # "query,value", "q_proj,v_proj", PEFT's default for Llama/T5.
        target = "qv"
    return rank, target


def _zero_stage(text: str) -> int:
    s = text.lower()
    if "full shard" in s or "full_shard" in s or "zero-3" in s or "zero3" in s or "fsdp" in s:
        return 3
    if "zero-2" in s:
        return 2
    if "zero-1" in s:
        return 1
    return 0


def _kind(text: str) -> str:
    s = text.lower()
    # Sources that say which torch stat they print win; "not stated" about *which stat* loses.
    if any(k in s for k in ("alloc/active/reserved not stated", "which of the three", "stat not")):
        return "unknown"
    if "which stat not stated" in s or s.startswith("'peak memory' (torchtune"):
        return "unknown"
    if "nvml" in s or "nvidia-smi" in s or "screenshot" in s or "monitor" in s:
        return "nvml_used"
    if s.startswith("peak active") or "active_bytes" in s:
        return "allocated"
    if "reserved" in s and "allocated" not in s:
        return "reserved"
    if "allocated" in s or "active" in s:
        return "allocated"
    return "unknown"


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float) and v > 0:
        return round(v)
    return None


# ------------------------------------------------------------------------------ VRAM rows
_VRAM_TASKS = {
    "lora": "lora",
    "qlora": "qlora",
    "full-finetune": "full_finetune",
    "pretraining": "pretrain",
    "inference-decode": "inference",
}


#: Tag (in ``notes``) of rows whose peak is a documented artefact of the source's code, not of
#: the job: they are scored, but never train corrections or calibrate upper bounds.
UNSHARDED_LOAD_QUIRK = (
    "[quirk:unsharded-load] lit-gpt @8641822 FSDP LoRA materialises the whole bf16 model on "
    "every rank before sharding, so max_memory_allocated includes the unsharded weights "
    "(measured − predicted ≈ full weight bytes on 2 and 4 GPUs)"
)


def _unsharded_load_quirk(r: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    fw = str(r.get("framework") or "").lower()
    return (
        "lit-gpt" in fw
        and spec.get("task") in ("lora", "qlora")
        and int(spec.get("n_gpus") or 1) > 1
        and spec.get("zero_stage") == 3
    )


def convert_vram_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """One ``vram_measured.jsonl`` row → a measurement row dict; raises ``_Skip``."""
    workload = r["workload"]
    meas_text = str(r.get("measurement") or "")
    par = str(r.get("parallelism") or "")
    opt_text = str(r.get("optimizer") or "")
    if workload == "model-load":
        raise _Skip("model-load only: weights on the GPU, not a job the scheduler runs")
    if workload == "inference-serving":
        raise _Skip(
            "vLLM profiler peak excludes the KV-cache pool vLLM pre-allocates afterwards; "
            "no prediction field counts the same thing"
        )
    if meas_text.startswith("BOUNDARY"):
        raise _Skip("boundary row: the longest sequence that fit, not a memory reading")
    if "offload" in par.lower() or "cpu" in opt_text.lower():
        raise _Skip("CPU offload of parameters/optimizer is not expressible in a JobSpec")
    if "optimizer_in_bwd=true" in opt_text.lower().replace(" ", ""):
        raise _Skip("optimizer_in_bwd (optimizer step fused into backward) is not a JobSpec field")
    arch = r.get("arch") or {}
    if isinstance(arch.get("layers"), str):
        raise _Skip("encoder-decoder (T5 family): the predictor models single-stack transformers")
    task = _VRAM_TASKS.get(workload)
    if task is None:
        raise _Skip(f"workload {workload!r} has no JobSpec task")
    model = _resolve_model(r["model"], arch, r.get("params_b"))
    weight = _dtype(r.get("weight_dtype"))
    if weight is None:
        raise _Skip("weight dtype not stated")
    compute = _dtype(r.get("compute_dtype")) or weight
    n_gpus = int(r.get("num_gpus") or 1)
    spec: dict[str, Any] = {
        "id": r["id"],
        "model": model,
        "task": task,
        "framework": _framework(r.get("framework")),
        "weight_dtype": weight,
        "compute_dtype": compute,
        "n_gpus": n_gpus,
    }
    if task == "qlora" and weight not in ("nf4", "int4", "fp4"):
        spec["weight_dtype"] = "nf4"
    notes: list[str] = []
    lpar = par.lower()
    if n_gpus > 1:
        if "tensor parallel" in lpar:
            spec["tensor_parallel"] = n_gpus
        elif "layer partitioning" in lpar or "device_map" in lpar:
            # Layers split across devices and run one after another: pipeline without overlap.
            spec["pipeline_parallel"] = n_gpus
            notes.append("sequential layer split mapped to pipeline_parallel=n_gpus")
    mb = _int(r.get("micro_batch_size"))
    if task == "inference":
        if r.get("input_len") is None or r.get("output_len") is None:
            raise _Skip("inference row without input/output lengths")
        spec["batch_size"] = mb or 1
        spec["input_len"] = int(r["input_len"])
        spec["output_len"] = int(r["output_len"])
        kv = _dtype(r.get("kv_cache_dtype"))
        if kv:
            spec["kv_cache_dtype"] = kv
    else:
        if mb is None:
            raise _Skip("training row without a micro batch size")
        if r.get("seq_len") is None:
            raise _Skip("training row without seq_len (dataset-dependent padding)")
        spec["batch_size"] = mb
        spec["seq_len"] = int(r["seq_len"])
        spec["optimizer"] = _optimizer(opt_text)
        ga = re.search(r"grad(?:ient)? accumulation (\d+)", opt_text.lower())
        if ga:
            spec["gradient_accumulation"] = int(ga.group(1))
        gc = r.get("gradient_checkpointing")
        if gc is None and spec["framework"] == "torchtune":
            # Every torchtune full/LoRA recipe config ships enable_activation_checkpointing: True.
            gc = True
            notes.append("gradient_checkpointing not stated; torchtune configs default to True")
        elif gc is None:
            gc = "activation checkpointing" in lpar
            notes.append(f"gradient_checkpointing not stated; assumed {gc}")
        spec["gradient_checkpointing"] = bool(gc)
        if n_gpus > 1:
            spec["zero_stage"] = _zero_stage(par)
        if task in ("lora", "qlora"):
            rank, target = _lora(r.get("peft"))
            if rank is None:
                raise _Skip("LoRA rank not stated")
            spec["lora_rank"] = rank
            spec["lora_target"] = target
        if "bf16" in str(r.get("optimizer_state_dtype") or "") and weight == "bf16":
            notes.append("optimizer states kept in bf16 (bf16-true); JobSpec assumes fp32 states")
    gpu, mem = _gpu(r.get("gpu_model"))
    notes.append(f"measurement: {meas_text}")
    if r.get("unit_basis") == "GB(unspecified)":
        notes.append("source said GB without saying 1e9 or 2^30")
    if r.get("notes"):
        notes.append(str(r["notes"]))
    if _unsharded_load_quirk(r, spec):
        notes.append(UNSHARDED_LOAD_QUIRK)
    return measurement_row(
        id=f"pub-vram-{r['id']}",
        origin="published",
        source=f"{r.get('source_name', '')} | {r['source']}".strip(" |"),
        spec=spec,
        gpu=gpu,
        gpu_model=r.get("gpu_model"),
        gpu_memory_gib=mem,
        peak_vram_gib=float(r["peak_gib"]),
        measurement=_kind(meas_text),
        confidence=str(r.get("confidence") or "medium"),
        software={"framework": r.get("framework"), "version": r.get("framework_version")},
        notes="; ".join(notes),
    )


# ------------------------------------------------------------------------------ runtime rows
def _training_task(workload: str) -> str | None:
    w = workload.lower()
    if w.startswith("pretrain"):
        return "pretrain"
    if w.startswith("full_finetune"):
        return "full_finetune"
    if w in ("lora", "qlora"):
        return w
    return None


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
    task = _training_task(workload)
    fields: dict[str, Any] = {}
    spec: dict[str, Any] = {
        "id": r["id"],
        "model": model,
        "framework": _framework(r.get("framework")),
        "n_gpus": n_gpus,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
    }
    if task is not None:
        gbs, mbs, seq = _int(r.get("global_batch_size")), _int(r.get("micro_batch_size")), None
        seq = _int(r.get("seq_len"))
        if gbs is None or seq is None:
            raise _Skip("training row without global batch size or seq_len")
        mbs = mbs or 1
        if n_gpus % (tp * pp):
            raise _Skip(f"tp×pp={tp * pp} does not divide {n_gpus} GPUs")
        dp_spec = n_gpus // (tp * pp)
        if gbs % (mbs * dp_spec):
            raise _Skip(
                f"global batch {gbs} is not micro batch {mbs} × data-parallel {dp_spec} × GA"
            )
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
        if dp_spec > 1 and ("FSDP" in par or "fsdp" in par.lower()):
            spec["zero_stage"] = 3
        elif dp_spec > 1 and spec["framework"] == "megatron":
            # Megatron-Core's distributed optimizer shards optimizer states across DP ranks.
            spec["zero_stage"] = 1
        if task in ("lora", "qlora"):
            notes.append("LoRA rank not in the row; JobSpec default rank 16 used")
        # runtime_s would repeat step_time_s (steps=1) and double-count the row in reports.
        fields["step_time_s"] = step
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


def metric_is(r: Mapping[str, Any], name: str) -> bool:
    return bool(r.get("metric") == name)


def _inference_fields(
    r: Mapping[str, Any], spec: dict[str, Any], precision: str, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = str(r["workload"])
    metric, unit = str(r["metric"]), str(r.get("unit") or "")
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
        replicas = int(r.get("num_gpus") or 1) // max(
            int(r.get("tp") or 1) * int(r.get("pp") or 1), 1
        )
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


def other_get(r: Mapping[str, Any], key: str) -> float | None:
    v = (r.get("other_metrics") or {}).get(key)
    return float(v) if isinstance(v, int | float) and not math.isnan(v) else None


# ------------------------------------------------------------------------------ driver
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise DataError(f"validation file {str(path)!r} not found; set SNUGFIT_SHARED")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def convert_published(validation_dir: str | Path | None = None) -> Conversion:
    """Convert every row of the two validation files (order follows the files), then run the
    data checks of :mod:`predictor._checks` and tag the rows that fail them."""
    base = Path(validation_dir) if validation_dir else shared_dir() / "validation"
    rows: list[dict[str, Any]] = []
    skipped: list[SkippedRow] = []
    for fname, conv in (
        ("vram_measured.jsonl", convert_vram_row),
        ("runtime_measured.jsonl", convert_runtime_row),
    ):
        for r in _read_jsonl(base / fname):
            try:
                rows.append(conv(r))
            except _Skip as exc:
                skipped.append(SkippedRow(str(r.get("id")), fname, str(exc)))
            except (SpecError, DataError) as exc:
                skipped.append(SkippedRow(str(r.get("id")), fname, f"invalid spec: {exc}"))
    # Rows that contradict physics or their own table are kept, tagged non-calibratable.
    failures = check_rows(rows)
    tag_failures(rows, failures)
    return Conversion(rows, skipped, failures)


def write_published(
    output: str | Path | None = None, validation_dir: str | Path | None = None
) -> Conversion:
    """Regenerate ``datasets/measured/published.jsonl`` (and its ``skipped`` sidecar)."""
    conv = convert_published(validation_dir)
    out = Path(output) if output else datasets_dir() / "measured" / "published.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for row in conv.rows:
            fh.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
    skipped_path = out.with_name(out.stem + ".skipped.tsv")
    with skipped_path.open("w", encoding="utf-8") as fh:
        fh.write("id\tfile\treason\n")
        for s in conv.skipped:
            fh.write(f"{s.id}\t{s.file}\t{s.reason}\n")
    checks_path = out.with_name(out.stem + ".checks.tsv")
    with checks_path.open("w", encoding="utf-8") as fh:
        fh.write("id\tcheck\treason\n")
        for f in conv.failures:
            fh.write(f"{f.id}\t{f.check}\t{f.reason}\n")
    return conv


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    conv = write_published(args[0] if args else None)
    print(f"wrote {len(conv.rows)} rows; skipped {len(conv.skipped)}")
    print(f"{len({f.id for f in conv.failures})} rows fail a data check (non-calibratable):")
    for f in conv.failures:
        print(f"  {f.id}\t{f.check}\t{f.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
