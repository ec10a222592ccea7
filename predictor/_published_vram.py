"""``vram_measured.jsonl`` rows (peak memory readings) converted into measurement rows."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._checks import PAGED_32BIT_NOTE
from ._published_fields import (
    _dtype,
    _framework,
    _gpu,
    _int,
    _kind,
    _lora,
    _optimizer,
    _Skip,
    _zero_stage,
)
from ._published_models import _resolve_model
from .measurements import measurement_row

__all__ = ["PREALLOCATED_KV_NOTE", "convert_vram_row"]

_VRAM_TASKS = {
    "lora": "lora",
    "qlora": "qlora",
    "full-finetune": "full_finetune",
    "pretraining": "pretrain",
    "inference-decode": "inference",
}


#: Tags (in ``notes``) of rows whose peak is a documented artefact of the source's code, not of
#: the job: they are scored, but never train corrections or calibrate upper bounds.
#: (The lit-gpt @8641822 FSDP LoRA rows once carried ``[quirk:unsharded-load]``; their peak is
#: FSDP's unsharded gradients under ``no_sync``, which the tracer now models: see
#: ``predictor/traced/_fsdp.py``.)


#: The cache a torchtune generate row's recipe preallocates, read at the cited commit; the
#: JobSpec fields ``kv_cache_max_len`` and ``kv_cache_query_heads`` say it, so the row is an
#: ordinary one (it carried ``[quirk:preallocated-kv]`` while no field could).
PREALLOCATED_KV_NOTE = (
    "kv_cache_max_len=4096, kv_cache_query_heads=true (torchtune @20747cd87 recipes/generate.py "
    "calls model.setup_caches(max_batch_size=1) before generating: modules/transformer.py sizes "
    "each layer's KVCache (max_batch_size, num_heads, max_seq_len, head_dim) with the 32 query "
    "heads (attention.py expands k/v to num_heads before caching) and the builder's max_seq_len "
    "(llama3_8b: 4096), plus a max_seq_len^2 bool causal mask (16 MiB, not modelled): 32 layers "
    "x 2 x 4096 x 32 x 128 x 2 B = 2.0 GiB whatever the prompt and output lengths (the row's "
    "note says 8192 and ~1 GiB; the code at that commit says 4096 and 2.0 GiB). Weights 14.96 "
    "GiB + 2.0 + 0.016 = 16.98 GiB against the measured 17.05)"
)
_PREALLOCATED_KV_SOURCES = ("recipes/generate.py @20747cd87",)
_PREALLOCATED_KV_FIELDS = {"kv_cache_max_len": 4096, "kv_cache_query_heads": True}


def _preallocated_kv(r: Mapping[str, Any], spec: dict[str, Any], notes: list[str]) -> None:
    """The preallocated cache of a generate recipe read at its commit, as JobSpec fields."""
    source = str(r.get("source") or "")
    if r.get("workload") == "inference-decode" and any(
        key in source for key in _PREALLOCATED_KV_SOURCES
    ):
        spec.update(_PREALLOCATED_KV_FIELDS)
        notes.append("read in the source's code: " + PREALLOCATED_KV_NOTE)


def convert_vram_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """One ``vram_measured.jsonl`` row → a measurement row dict; raises ``_Skip``."""
    workload = r["workload"]
    meas_text = str(r.get("measurement") or "")
    par = str(r.get("parallelism") or "")
    opt_text = str(r.get("optimizer") or "")
    _check_expressible(r, workload, meas_text, par, opt_text)
    arch = r.get("arch") or {}
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
    _double_quant(r, spec)
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
        _training_fields(r, spec, task, weight, mb, par, opt_text, notes)
    gpu, mem = _gpu(r.get("gpu_model"))
    notes.append(f"measurement: {meas_text}")
    if r.get("unit_basis") == "GB(unspecified)":
        notes.append("source said GB without saying 1e9 or 2^30")
    if r.get("notes"):
        notes.append(str(r["notes"]))
    if task == "inference":
        _preallocated_kv(r, spec, notes)
    else:
        _stated_memory_flags(r, spec, notes)
    hardware = _stated_hardware(meas_text, notes)
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
        hardware=hardware,
        notes="; ".join(notes),
    )


def _stated_hardware(meas_text: str, notes: list[str]) -> dict[str, Any]:
    """The CUDA context an nvidia-smi row's source measured, as ``hardware``."""
    ctx = _stated_context_gib(meas_text)
    if ctx is None or _kind(meas_text) != "nvml_used":
        return {}
    notes.append(f"the source states a {ctx:.2f} GiB CUDA context on its GPU")
    return {"cuda_context_gib": ctx}


def _double_quant(r: Mapping[str, Any], spec: dict[str, Any]) -> None:
    """nf4 with or without double quantisation, where the row's text says which."""
    if spec["weight_dtype"] != "nf4":
        return
    wtext = f"{r.get('weight_dtype') or ''} {r.get('quote') or ''}".lower()
    if "double" in wtext or "nf4-dq" in wtext:
        spec["double_quant"] = True
    elif "bitsandbytes" in wtext:
        spec["double_quant"] = False  # bnb.nf4: one fp32 absmax per 64 weights


# What a source states about the run's memory-relevant flags (torchtune's tables and configs
# name them); each becomes the JobSpec field, so a compiled or offloaded run is never scored as
# an eager one. "no compile" / "standard cross-entropy" are stated too and kept as False.
_COMPILE = re.compile(
    r"\+ torch\.compile|torch\.compile on|compile=true|uses packed \d+, compile|uses torch compile"
)
_CHUNKED = re.compile(r"cewithchunkedoutputloss|chunked ce")
_OFFLOAD = re.compile(
    r"\+ activation offloading|activation_offloading=true|and activation offloading"
)
_BF16_TRUE = re.compile(r"bf16-true")
#: torchtune commits of the rows that predate chunked cross-entropy (read at the commit:
#: recipes/configs/*.yaml ``loss: _component_: torch.nn.CrossEntropyLoss``).
_TORCHTUNE_BEFORE_CHUNKED_CE = ("@0217d44c2",)


def _stated_memory_flags(r: Mapping[str, Any], spec: dict[str, Any], notes: list[str]) -> None:
    """``compile``, ``chunked_loss``, ``activation_offload`` and ``adapter_dtype`` where the
    row's framework text, quote or notes state them."""
    text = " ".join(str(r.get(k) or "") for k in ("framework", "quote", "notes")).lower()
    stated: list[str] = []
    if spec["framework"] == "torchtune":
        if _COMPILE.search(text):
            spec["compile"] = True
            stated.append("compile")
        if _CHUNKED.search(text):
            spec["chunked_loss"] = True
            stated.append("chunked_loss")
        elif "standard cross-entropy" in text:
            spec["chunked_loss"] = False
            stated.append("chunked_loss=false")
        elif any(c in str(r.get("source") or "") for c in _TORCHTUNE_BEFORE_CHUNKED_CE):
            spec["chunked_loss"] = False
            stated.append(
                "chunked_loss=false (torchtune before CEWithChunkedOutputLoss, 4fba6cd44 "
                "2024-08-28: its configs name torch.nn.CrossEntropyLoss on the whole logits)"
            )
        if _OFFLOAD.search(text):
            spec["activation_offload"] = True
            stated.append("activation_offload")
    litgpt = "lit-gpt" in text or "litgpt" in text
    if (
        litgpt
        and spec["task"] in ("lora", "qlora")
        and spec.get("weight_dtype") != "fp32"
        and _BF16_TRUE.search(text)
    ):
        # LitGPT's own LoRA under --precision bf16-true: adapters (and their AdamW states) bf16,
        # no PEFT input upcast.
        spec["adapter_dtype"] = "bf16"
        stated.append("adapter_dtype=bf16")
    if spec["task"] in ("lora", "qlora"):
        _program_facts(r, spec, text, litgpt, stated)
    for key, fields, why in _SOURCE_LOOPS:
        if key in str(r.get("source") or ""):
            spec.update(fields)
            stated.append(why)
    if stated:
        notes.append("stated by the source: " + ", ".join(stated))


_DROPOUT = re.compile(r"dropout[ =:]*(0?\.\d+)")

#: What a source's code ran, read at the commit the row names (not stated in its table):
#: (substring of the row's ``source``, the JobSpec fields, where each comes from).
_SOURCE_PROGRAMS: tuple[tuple[str, dict[str, Any], str], ...] = (
    (
        "llama-cookbook/pull/41",
        {
            "lora_dropout": 0.05,
            "attn_implementation": "eager",
            "adapter_dtype": "fp32",
            "transformers_version": "4.31",
            "use_cache": True,
        },
        "llama-recipes @e5970e2e: configs/peft.py lora_dropout=0.05; requirements.txt "
        "transformers>=4.31, whose LlamaAttention is eager (SDPA came in 4.36), and 4.31.0 "
        "(2023-07-18) was the newest release at the merge (4.32.0: 2023-08-22); "
        "llama_finetuning.py loads LlamaForCausalLM.from_pretrained without use_cache=False "
        "and checkpoints with FSDP's apply_fsdp_checkpointing, not HF's, so 4.31's "
        "LlamaModel keeps use_cache=config.use_cache (true) and returns every layer's K/V; "
        "model.to(bfloat16) runs before get_peft_model, and peft then made fp32 adapters "
        "(nn.Linear in the default dtype) and cast their inputs to fp32",
    ),
    (
        "@0217d44c2",
        {"lora_dropout": 0.05},
        "torchtune @0217d44c2: the lora_llama2_* builders default lora_dropout=0.05 and the "
        "configs do not set it",
    ),
)


#: The training loop a source ran, where it differs from torch >= 2.0's (any training task).
_SOURCE_LOOPS: tuple[tuple[str, dict[str, Any], str], ...] = (
    (
        # The page's own nvidia-smi output is dated Tue Jan 11 2022: torch 1.10 was the newest
        # release (1.11 came on 2022-03-10), and its code loads
        # AutoModelForSequenceClassification with binary labels.
        "perf_train_gpu_one.mdx @0016acf7",
        {"zero_grad_set_to_none": False, "torch_version": "1.10", "head": "classification"},
        "zero_grad_set_to_none=false, torch_version=1.10 (run 2022-01-11 per its nvidia-smi "
        "output, before torch 1.11 and 2.0 and transformers#22136: the Trainer's "
        "`model.zero_grad()` zeroed the gradients), head=classification "
        "(AutoModelForSequenceClassification)",
    ),
)


def _program_facts(
    r: Mapping[str, Any], spec: dict[str, Any], text: str, litgpt: bool, stated: list[str]
) -> None:
    """``lora_dropout`` (and, per source, the attention kernel and adapter dtype) of the
    program the source ran: stated in the row, else read from its code at its commit."""
    source = str(r.get("source") or "")
    m = _DROPOUT.search(str(r.get("peft") or "").lower())
    if m:
        spec["lora_dropout"] = float(m.group(1))
        stated.append(f"lora_dropout={spec['lora_dropout']}")
        return
    if litgpt:
        # lit-gpt @8641822 finetune/lora.py `lora_dropout = 0.05`; litgpt finetune/lora.py
        # (`lora_dropout: float = 0.05`) and every config_hub yaml (`lora_dropout: 0.05`).
        spec["lora_dropout"] = 0.05
        stated.append("lora_dropout=0.05 (LitGPT's default)")
        return
    for key, fields, why in _SOURCE_PROGRAMS:
        if key in source:
            spec.update(fields)
            stated.append(", ".join(f"{k}={v}" for k, v in fields.items()) + f" ({why})")
            return


def _stated_context_gib(meas_text: str) -> float | None:
    """The CUDA context an nvidia-smi reading includes, where the source measured it."""
    m = re.search(r"~?\s*(\d+(?:\.\d+)?)\s*MiB CUDA context", meas_text)
    return round(float(m.group(1)) / 1024.0, 3) if m else None


def _check_expressible(
    r: Mapping[str, Any], workload: str, meas_text: str, par: str, opt_text: str
) -> None:
    """Raise ``_Skip`` for a row no JobSpec expresses (not a job, offload, encoder-decoder)."""
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
    if isinstance((r.get("arch") or {}).get("layers"), str):
        raise _Skip("encoder-decoder (T5 family): the predictor models single-stack transformers")


def _litgpt_pretrain_accumulation(r: Mapping[str, Any], mb: int | None, n_gpus: int) -> int | None:
    """LitGPT's pretrain script accumulates ``global_batch_size / (devices x micro batch)``
    micro-steps per optimizer step (litgpt/args.py ``gradient_accumulation_iters``); its
    ``global_batch_size`` is the row's ``--train.global_batch_size`` or the script's default,
    512 (extensions/thunder/pretrain.py @26857050 ``TrainArgs(global_batch_size=512)``)."""
    fw = str(r.get("framework") or "").lower()
    if "litgpt pretrain" not in fw or not mb:
        return None
    m = re.search(r"global_batch_size (\d+)", str(r.get("notes") or ""))
    total = int(m.group(1)) if m else 512
    return max(1, total // (n_gpus * mb))


def _litgpt_finetune_accumulation(r: Mapping[str, Any], mb: int | None, task: str) -> int | None:
    """lit-gpt @8641822's ``finetune/lora.py`` (the script behind its resource tables' LoRA
    and QLoRA rows) sets ``batch_size = 128`` and ``gradient_accumulation_iters = batch_size //
    micro_batch_size``: the tables' "minibatch size of 128" over the row's micro batch."""
    fw = str(r.get("framework") or "").lower()
    if "lit-gpt @8641822" not in fw or task not in ("lora", "qlora") or not mb:
        return None
    return max(1, 128 // mb)


def _training_fields(
    r: Mapping[str, Any],
    spec: dict[str, Any],
    task: str,
    weight: str,
    mb: int | None,
    par: str,
    opt_text: str,
    notes: list[str],
) -> None:
    """Fill a training row's batch, sequence, optimizer, checkpointing, ZeRO and LoRA fields."""
    lpar = par.lower()
    n_gpus = spec["n_gpus"]
    if mb is None:
        raise _Skip("training row without a micro batch size")
    if r.get("seq_len") is None:
        raise _Skip("training row without seq_len (dataset-dependent padding)")
    spec["batch_size"] = mb
    spec["seq_len"] = int(r["seq_len"])
    spec["optimizer"] = _optimizer(opt_text)
    if "paged" in opt_text.lower() and spec["optimizer"] == "adamw":
        notes.append(PAGED_32BIT_NOTE)
    ga = re.search(r"grad(?:ient)? accumulation (\d+)", opt_text.lower())
    if ga:
        spec["gradient_accumulation"] = int(ga.group(1))
    elif (accum := _litgpt_pretrain_accumulation(r, mb, n_gpus)) is not None:
        spec["gradient_accumulation"] = accum
        notes.append(f"gradient_accumulation {accum} = global batch / (GPUs x micro batch)")
    elif (accum := _litgpt_finetune_accumulation(r, mb, task)) is not None:
        spec["gradient_accumulation"] = accum
        notes.append(f"gradient_accumulation {accum} = 128 // micro batch (finetune/lora.py)")
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
