"""The H200 sweep: which jobs, in what order, and how long each should take.

``h200_jobs()`` builds the job list that ``datasets/sweeps/h200.yaml`` holds; ``write_sweep``
writes it with each job's estimated seconds, cheapest first, and a header with the totals.
The estimate is a deliberately plain roofline plus fixed costs, used only to order and size
the sweep (the predictor's own model must not be circular with the data it will be judged on):

* fixed per job: ``JOB_OVERHEAD_S`` (fork from the preloaded forkserver, CUDA context, warm-up)
  plus ``BUILD_S_PER_BPARAM`` × billions of parameters (random init on the GPU);
* training: ``steps_run`` × max(FLOPs / (``MFU`` × peak), launch floor), FLOPs = 6·N·tokens
  (8·N with checkpointing, 4·N for LoRA/QLoRA: no weight gradients), plus the optimizer
  update reading/writing 16 bytes per trainable parameter at HBM speed;
* inference: prefill 2·N_active·b·input / (``MFU`` × peak) and, per decode step,
  max((weight + KV bytes) / (``MBU`` × HBM), launch floor); HF eager decode is launch-bound
  for small batches, ``DECODE_FLOOR_S_PER_LAYER`` per layer plus ``DECODE_FLOOR_S``;
* a job whose rough memory need exceeds the GPU is an OOM and costs only its fixed part.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from predictor.gpus import get_gpu
from predictor.models import resolve_model
from predictor.spec import JobSpec, Task, parse_spec

__all__ = ["estimate_job_s", "h200_jobs", "write_sweep"]

JOB_OVERHEAD_S = 1.2
BUILD_S_PER_BPARAM = 0.08
MFU = 0.35
MBU = 0.6
DECODE_FLOOR_S = 0.004
DECODE_FLOOR_S_PER_LAYER = 0.0003
TRAIN_FLOOR_S_PER_LAYER = 0.002
CALIBRATION_S = 60.0
TRAIN_STEPS = 4  # 1 warm-up + 3 timed (workers/profile/_job.py MAX_TRAIN_STEPS caps at 6)
GIB = 1024**3

#: A small Mixtral-style MoE (the catalogue's MoEs are 30B+ and do not train on one GPU):
#: 8 experts, top-2, 1.22B total / 0.39B active parameters.
MOE_MINI: dict[str, Any] = {
    "name": "moe-mini-8x2",
    "n_layers": 16,
    "hidden_size": 1024,
    "n_heads": 16,
    "n_kv_heads": 8,
    "intermediate_size": 2816,
    "vocab_size": 32000,
    "n_experts": 8,
    "n_active_experts": 2,
    "family": "mixtral",
    "max_position_embeddings": 32768,
}


def _bytes_per_weight(spec: JobSpec) -> float:
    assert spec.weight_dtype is not None
    return spec.weight_dtype.bits / 8


def _rough_peak_gib(spec: JobSpec) -> float:
    """A coarse memory need, only to tell a sure OOM (fast) from a run (slow) when sizing."""
    arch = spec.arch
    n = arch.total_params()
    static: float
    if spec.task in (Task.FULL_FINETUNE, Task.PRETRAIN):
        opt = spec.optimizer.value if spec.optimizer is not None else "none"
        # fp32 weights + grads (8 B) + AdamW m, v (8 B); 8-bit states 2 B; SGD momentum 4 B.
        static = n * {"adamw": 16, "adamw_8bit": 10, "paged_adamw_8bit": 10}.get(opt, 12)
    else:
        static = n * _bytes_per_weight(spec)
    if spec.task.is_training:
        assert spec.seq_len is not None
        tokens = spec.batch_size * spec.seq_len
        per_tok_layer = 2 * arch.hidden_size * (2 if spec.gradient_checkpointing else 18)
        act = tokens * arch.n_layers * per_tok_layer + tokens * arch.vocab_size * 4 * 2
    else:
        assert spec.input_len is not None and spec.output_len is not None
        tokens = spec.batch_size * (spec.input_len + spec.output_len)
        act = tokens * arch.kv_elems_per_token() * 2 + (
            spec.batch_size * spec.input_len * arch.vocab_size * 4
        )
    return (static + act) / GIB + 1.0


def estimate_job_s(spec: JobSpec, gpu_name: str = "H200-141GB") -> float:
    """Estimated wall seconds for the profiler to run ``spec`` on ``gpu_name`` (see module)."""
    gpu = get_gpu(gpu_name)
    arch = spec.arch
    n_total = arch.total_params()
    n_active = arch.active_params(include_input_embedding=False)
    fixed = JOB_OVERHEAD_S + BUILD_S_PER_BPARAM * n_total / 1e9
    if _rough_peak_gib(spec) > gpu.memory_gib:
        return fixed
    peak_flops = gpu.peak_tflops_for("bf16") * 1e12
    bw = gpu.hbm_bandwidth_gbps * 1e9
    if spec.task.is_training:
        assert spec.seq_len is not None and spec.steps is not None
        assert spec.gradient_accumulation is not None
        tokens = spec.batch_size * spec.seq_len * spec.gradient_accumulation
        factor = 4.0 if spec.task.is_peft else 6.0
        if spec.gradient_checkpointing:
            factor += 2.0
        compute = factor * n_active * tokens / (MFU * peak_flops)
        floor = TRAIN_FLOOR_S_PER_LAYER * arch.n_layers * spec.gradient_accumulation
        if spec.task.is_peft:
            assert spec.lora_rank is not None and spec.lora_target is not None
            trainable = arch.lora_params(spec.lora_rank, spec.lora_target.value)
        else:
            trainable = n_total
        update = 2 * 16 * trainable / bw
        steps = max(min(spec.steps, 6), 2)
        return fixed + steps * (max(compute, floor) + update)
    assert spec.input_len is not None and spec.output_len is not None
    prefill = 2 * n_active * spec.batch_size * spec.input_len / (MFU * peak_flops)
    weight_bytes = n_active * _bytes_per_weight(spec)
    kv_bytes_per_tok = arch.kv_elems_per_token() * 2
    steps = spec.output_len
    avg_ctx = spec.input_len + spec.output_len / 2
    per_step_mem = (weight_bytes + spec.batch_size * avg_ctx * kv_bytes_per_tok) / (MBU * bw)
    floor = DECODE_FLOOR_S + DECODE_FLOOR_S_PER_LAYER * arch.n_layers
    decode = steps * max(per_step_mem, floor)
    warmup = 2 * floor + 0.05
    return fixed + prefill + decode + warmup


# ------------------------------------------------------------------------- the job list
_SMALL = ("gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")
_MID = ("llama-3.2-3b", "qwen2.5-3b", "phi-3-mini", "gemma-2-2b")
_LARGE = ("mistral-7b", "llama-3.1-8b", "qwen2.5-7b")
_XL = ("qwen2.5-14b", "llama-2-13b")
# Output 512 costs ~512 launch-bound decode steps; two small models carry that corner.
_LONG_DECODE = ("gpt2", "llama-3.2-1b")
_MOE_GRID = [(1, 256, 64), (16, 1024, 64), (64, 512, 32)]


# A catalogue name or an explicit architecture object, as a JobSpec's ``model``.
_Model = str | dict[str, Any]


def _model_key(model: _Model) -> str:
    return model if isinstance(model, str) else str(model["name"])


def _inference(model: _Model, b: int, i: int, o: int, **extra: Any) -> dict[str, Any]:
    """One inference job of batch ``b``, input ``i`` and output ``o`` tokens; ``extra`` (a
    weight dtype) stands before the shape, as the sweep file lists it."""
    shape = {"batch_size": b, "input_len": i, "output_len": o}
    return {"model": model, "task": "inference", **extra, **shape}


def _training(model: _Model, task: str, b: int, s: int, **extra: Any) -> dict[str, Any]:
    """One training job of ``TRAIN_STEPS`` steps, batch ``b`` and sequence ``s``; ``extra``
    (checkpointing, LoRA, dtypes, optimizer) stands after the shape."""
    return {
        "steps": TRAIN_STEPS,
        "model": model,
        "task": task,
        "batch_size": b,
        "seq_len": s,
        **extra,
    }


def _inference_jobs() -> Iterable[dict[str, Any]]:
    # (batch, input, output): the corners and middle of batch 1–64, input 128–4096, output 32–512.
    grid_small = [
        (1, 128, 32),
        (1, 2048, 256),
        (8, 512, 128),
        (16, 1024, 64),
        (32, 256, 128),
        (64, 128, 32),
        (4, 4096, 64),
        (64, 1024, 32),
        (8, 128, 512),
    ]
    grid_mid = [
        (1, 128, 64),
        (8, 1024, 128),
        (32, 512, 64),
        (64, 256, 32),
        (4, 4096, 32),
        (16, 2048, 32),
    ]
    grid_large = [
        (1, 512, 64),
        (8, 2048, 64),
        (32, 1024, 32),
        (64, 128, 32),
        (4, 4096, 32),
        (1, 128, 256),
    ]
    grid_xl = [(1, 256, 32), (16, 1024, 32), (64, 512, 32), (4, 4096, 32)]
    for model in _SMALL:
        for b, i, o in grid_small:
            if (model == "gpt2" and i + o > 1024) or (o == 512 and model not in _LONG_DECODE):
                continue
            yield _inference(model, b, i, o)
    for model in _MID:
        grid = grid_mid if model != "gemma-2-2b" else grid_mid[:3]
        for b, i, o in grid:
            yield _inference(model, b, i, o)
    rest: list[tuple[Sequence[_Model], list[tuple[int, int, int]]]] = [
        (_LARGE, grid_large),
        (_XL, grid_xl),
        ((MOE_MINI,), _MOE_GRID),
    ]
    for models, grid in rest:
        for arch in models:
            for b, i, o in grid:
                yield _inference(arch, b, i, o)
    # fp32 and 8-bit weights where HF supports them (int8 needs bitsandbytes: skipped without).
    for model, b, i, o in [
        ("gpt2", 8, 512, 64),
        ("qwen2.5-0.5b", 8, 1024, 64),
        ("llama-3.2-1b", 1, 512, 64),
    ]:
        yield _inference(model, b, i, o, weight_dtype="fp32")
    for model in ("llama-3.1-8b", "qwen2.5-7b"):
        yield _inference(model, 8, 1024, 32, weight_dtype="int8")
    for b, i, o in [(1, 128, 32), (32, 512, 32)]:
        yield _inference("bert-base-uncased", b, i, o)


def _training_jobs() -> Iterable[dict[str, Any]]:
    # Full fine-tune, AdamW mixed precision, with and without checkpointing.
    ft: list[tuple[_Model, int, int]] = [
        ("gpt2", 8, 1024),
        ("qwen2.5-0.5b", 4, 2048),
        ("llama-3.2-1b", 4, 2048),
        ("qwen2.5-1.5b", 2, 2048),
        ("llama-3.2-3b", 2, 2048),
        ("phi-3-mini", 1, 2048),
        ("qwen2.5-3b", 4, 1024),
        ("mistral-7b", 1, 1024),
        ("llama-3.1-8b", 1, 1024),
        (MOE_MINI, 4, 1024),
    ]
    for model, b, s in ft:
        for ckpt in (False, True):
            yield _training(model, "full_finetune", b, s, gradient_checkpointing=ckpt)
    for model, b, s in [("gpt2", 16, 1024), ("llama-3.2-1b", 16, 2048), ("qwen2.5-0.5b", 16, 4096)]:
        yield _training(model, "full_finetune", b, s, gradient_checkpointing=True)
    yield _training("gpt2", "pretrain", 16, 1024)
    yield _training("llama-3.2-1b", "pretrain", 8, 2048, gradient_checkpointing=True)
    # fp32 end to end (no autocast), and 8-bit / paged optimizers (bitsandbytes).
    for model, b, s in [("gpt2", 4, 1024), ("qwen2.5-0.5b", 2, 1024)]:
        yield _training(model, "full_finetune", b, s, weight_dtype="fp32", compute_dtype="fp32")
    for model, opt in [
        ("llama-3.2-1b", "adamw_8bit"),
        ("llama-3.2-3b", "adamw_8bit"),
        ("llama-3.2-3b", "paged_adamw_8bit"),
    ]:
        yield _training(model, "full_finetune", 2, 2048, optimizer=opt)
    # LoRA: rank 8–64, seq 512–4096, batch 1–16, three target sets, with and without ckpt.
    lora: list[tuple[_Model, int, int, int, str, bool]] = [
        ("qwen2.5-0.5b", 8, 512, 16, "all_linear", False),
        ("qwen2.5-0.5b", 16, 2048, 8, "qv", True),
        ("llama-3.2-1b", 16, 1024, 8, "all_linear", False),
        ("llama-3.2-1b", 64, 4096, 4, "all_linear", True),
        ("llama-3.2-1b", 8, 512, 16, "qv", False),
        ("qwen2.5-1.5b", 32, 2048, 4, "attention", False),
        ("llama-3.2-3b", 16, 2048, 4, "all_linear", False),
        ("llama-3.2-3b", 16, 2048, 4, "all_linear", True),
        ("llama-3.2-3b", 64, 1024, 8, "qv", False),
        ("phi-3-mini", 8, 4096, 2, "all_linear", True),
        ("gemma-2-2b", 16, 1024, 4, "all_linear", False),
        ("mistral-7b", 16, 1024, 4, "all_linear", False),
        ("mistral-7b", 16, 4096, 2, "all_linear", True),
        ("llama-3.1-8b", 8, 512, 8, "qv", False),
        ("llama-3.1-8b", 16, 2048, 2, "all_linear", False),
        ("llama-3.1-8b", 16, 2048, 2, "all_linear", True),
        ("llama-3.1-8b", 64, 1024, 4, "attention", False),
        ("llama-3.1-8b", 32, 4096, 1, "all_linear", False),
        ("llama-3.1-8b", 16, 4096, 16, "all_linear", True),
        ("qwen2.5-7b", 16, 2048, 4, "all_linear", True),
        ("qwen2.5-7b", 32, 1024, 8, "qv", False),
        ("qwen2.5-14b", 16, 1024, 2, "all_linear", False),
        ("qwen2.5-14b", 16, 2048, 4, "all_linear", True),
        ("qwen2.5-14b", 8, 512, 1, "qv", False),
        ("llama-2-13b", 16, 2048, 2, "all_linear", True),
        (MOE_MINI, 16, 1024, 4, "all_linear", False),
        (MOE_MINI, 16, 2048, 8, "all_linear", True),
    ]
    for model, r, s, b, target, ckpt in lora:
        lora_args = {"lora_rank": r, "lora_target": target, "gradient_checkpointing": ckpt}
        yield _training(model, "lora", b, s, **lora_args)
    qlora_args = {"lora_rank": 16, "optimizer": "paged_adamw_8bit", "gradient_checkpointing": True}
    for model, b, s in [
        ("llama-3.1-8b", 4, 2048),
        ("qwen2.5-14b", 2, 2048),
        ("mistral-7b", 8, 1024),
    ]:
        yield _training(model, "qlora", b, s, **qlora_args)


def _job_id(i: int, job: dict[str, Any]) -> str:
    task = {
        "inference": "inf",
        "full_finetune": "ft",
        "pretrain": "pt",
        "lora": "lora",
        "qlora": "qlora",
    }[job["task"]]
    parts = [f"h200-{i:03d}", task, _model_key(job["model"]), f"b{job['batch_size']}"]
    if job["task"] == "inference":
        parts += [f"i{job['input_len']}", f"o{job['output_len']}"]
    else:
        parts.append(f"s{job['seq_len']}")
        if "lora_rank" in job:
            parts.append(f"r{job['lora_rank']}-{job.get('lora_target', 'all_linear')}")
        if job.get("gradient_checkpointing"):
            parts.append("ckpt")
        if job.get("optimizer") not in (None, "adamw"):
            parts.append(str(job["optimizer"]))
    if job.get("weight_dtype"):
        parts.append(str(job["weight_dtype"]))
    return "-".join(parts).replace(".", "_")


def h200_jobs() -> list[tuple[dict[str, Any], float]]:
    """``(job dict with id, estimated seconds on an H200)``, cheapest first.

    Jobs are not pinned to a GPU type: the same sweep profiles any GPU (more of it OOMs on
    smaller ones), and the row's ``gpu`` says where it ran.
    """
    jobs = [*_inference_jobs(), *_training_jobs()]
    priced = []
    for job in jobs:
        head = {"model": job["model"], "task": job["task"], "framework": "hf"}
        full = {**head, **{k: v for k, v in job.items() if k not in head}}
        priced.append((full, estimate_job_s(parse_spec(full))))
    priced.sort(key=lambda p: p[1])
    out = []
    for i, (job, est) in enumerate(priced, 1):
        out.append(({"id": _job_id(i, job), **job}, est))
    return out


def _flow(value: Any) -> str:
    """One-line YAML flow style for a job (keys in insertion order, readable diffs)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def write_sweep(path: str | Path, jobs: Sequence[tuple[dict[str, Any], float]]) -> float:
    """Write the sweep YAML with a header and per-job estimates; return the total estimate."""
    total = sum(est for _, est in jobs) + CALIBRATION_S
    n_oom = sum(
        1 for job, _ in jobs if _rough_peak_gib(parse_spec(job)) > get_gpu("H200-141GB").memory_gib
    )
    lines = [
        "# H200 profiling sweep for snugfit (issue #4). Generated by",
        "#   python -c 'from workers.profile.sweep import *; "
        'write_sweep("datasets/sweeps/h200.yaml", h200_jobs())\'',
        "# Run:  snugfit profile --input datasets/sweeps/h200.yaml \\",
        "#         --output datasets/measured/h200-YYYYMMDD.jsonl --device cuda --calibrate",
        "#",
        f"# {len(jobs)} jobs, cheapest first (a sweep cut short still covers the most axes).",
        f"# Estimated total on one H200: {total:.0f} s = {total / 60:.1f} min, including "
        f"{CALIBRATION_S:.0f} s calibration;",
        f"# {n_oom} jobs are expected to OOM (recorded as oom rows; they cost only start-up).",
        "# Per-job estimate (the `# est` comment), from workers/profile/sweep.py:",
        f"#   fixed {JOB_OVERHEAD_S} s + {BUILD_S_PER_BPARAM} s per billion params (fork, "
        "CUDA context, random init, warm-up);",
        f"#   training: steps x max(k*N_active*tokens / ({MFU} x 989 TFLOP/s), "
        f"{TRAIN_FLOOR_S_PER_LAYER} s x layers)",
        "#             + 32 bytes/trainable param / 4.8 TB/s; k = 6 (full), 4 (LoRA), +2 ckpt;",
        f"#   inference: 2*N*b*input / ({MFU} x peak) + output x max((weights + KV bytes) / "
        f"({MBU} x 4.8 TB/s),",
        f"#              {DECODE_FLOOR_S} s + {DECODE_FLOOR_S_PER_LAYER} s x layers) "
        "(HF eager decode is launch-bound at small batch).",
        "# Estimates order and size the sweep only; the measured rows are the facts.",
        "# Jobs needing bitsandbytes (int8 weights, 8-bit/paged AdamW, QLoRA) are skipped with a",
        "# reason in OUTPUT.skipped.jsonl when it is not installed.",
        "",
    ]
    for job, est in jobs:
        lines.append(f"- {_flow(job)}  # est {est:.1f} s")
    text = "\n".join(lines) + "\n"
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return total


def _check_models() -> None:
    for name in (*_SMALL, *_MID, *_LARGE, *_XL):
        resolve_model(name)


if __name__ == "__main__":  # pragma: no cover - a maintenance entry point
    _check_models()
    print(f"{write_sweep('datasets/sweeps/h200.yaml', h200_jobs()):.0f} s")
