"""Run one JobSpec for real, in the current process, and report what it used.

This module runs inside the profiler's child process (see ``workers/profile/run.py``): it may
initialise CUDA, leak memory or hang, and the parent survives all of it. It returns a plain
dict (``Outcome``) that the parent turns into a ``datasets/measured`` row.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from predictor.spec import DType, JobSpec, Optimizer, Task, parse_spec
from workers.nvml import Nvml, PeakSampler, index_for_uuid, open_nvml
from workers.profile._model import UnsupportedJob, attn_implementation, build_model
from workers.profile._supported import check_supported

__all__ = ["TRAIN_WARMUP_STEPS", "environment", "run_job"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

GIB = 1024**3
#: Steps before timing starts: the first step pays for kernel selection and allocator growth.
TRAIN_WARMUP_STEPS = 1
#: Training steps actually run per job at most; a spec asking for more is timed, not finished.
MAX_TRAIN_STEPS = 6

Outcome = dict[str, Any]


def _torch_dtype(dtype: DType) -> Any:
    import torch

    return {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}[dtype]


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was requested but torch sees no CUDA GPU; use 'auto'")
    return device


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# ------------------------------------------------------------------------- environment
def environment(device: str, nvml: Nvml | None = None, nvml_index: int | None = None) -> Outcome:
    """Hardware and software facts of this process's device (what the row's dicts hold)."""
    import torch
    import transformers

    hardware: dict[str, Any] = {
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "host_os": platform.platform(),
    }
    software: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "harness": "snugfit profile",
    }
    for name in ("peft", "bitsandbytes", "accelerate"):
        try:
            mod = __import__(name)
            software[name] = getattr(mod, "__version__", "unknown")
        except Exception:
            software[name] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        hardware.update(
            gpu_name=props.name,
            gpu_memory_gib=round(props.total_memory / GIB, 3),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        software.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        if nvml is not None:
            hardware["driver"] = nvml.driver_version()
            hardware["cuda_driver"] = nvml.cuda_driver_version()
            if nvml_index is not None:
                hardware["nvml_index"] = nvml_index
    return {"hardware": hardware, "software": software}


# ------------------------------------------------------------------------- building
def _quantise_linears(model: Any, spec: JobSpec, device: str) -> Any:
    """Swap every linear but the LM head for its bitsandbytes 4/8-bit form, one at a time.

    The bf16 model is built first (random init has no checkpoint to stream from), so the caller
    restarts peak tracking after this: loading a real checkpoint with ``BitsAndBytesConfig``
    quantises as weights stream in and never holds the whole bf16 copy.
    """
    import bitsandbytes as bnb
    import torch

    four_bit = spec.weight_dtype in (DType.NF4, DType.INT4)
    quant_type = "nf4" if spec.weight_dtype == DType.NF4 else "fp4"
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or child_name == "lm_head":
                continue
            w = child.weight.data
            q: Any
            if four_bit:
                q = bnb.nn.Linear4bit(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    compute_dtype=torch.bfloat16,
                    quant_type=quant_type,
                    device="meta",
                )
                q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=quant_type).to(
                    device
                )
            else:
                q = bnb.nn.Linear8bitLt(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    has_fp16_weights=False,
                    threshold=6.0,
                    device="meta",
                )
                q.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False).to(
                    device
                )
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, child_name, q)
            del w, child
    return model


def _build(spec: JobSpec, device: str) -> tuple[Any, str]:
    """The model on ``device`` and a one-line description of its precision."""
    import torch

    if spec.weight_dtype in (DType.INT8, DType.NF4, DType.INT4):
        model = build_model(spec.arch, dtype=torch.bfloat16, device=device)
        return _quantise_linears(model, spec, device), f"bitsandbytes {spec.weight_dtype} weights"
    assert spec.weight_dtype is not None
    weight = _torch_dtype(spec.weight_dtype)
    if spec.task in (Task.FULL_FINETUNE, Task.PRETRAIN) and spec.compute_dtype != DType.FP32:
        # Mixed precision the way HF Trainer(bf16=True) runs it: fp32 master weights, grads and
        # AdamW states, matmuls under bf16 autocast -- the "16 bytes/param" case.
        return build_model(spec.arch, dtype=torch.float32, device=device), (
            f"amp: fp32 master weights, {spec.compute_dtype} autocast"
        )
    return build_model(spec.arch, dtype=weight, device=device), f"{spec.weight_dtype} weights"


def _autocast(spec: JobSpec, device: str, model_dtype: Any) -> Any:
    import torch

    compute = spec.compute_dtype
    assert compute is not None
    if compute in (DType.FP8, DType.FP4):
        return nullcontext()
    if compute in (DType.BF16, DType.FP16) and model_dtype != _torch_dtype(compute):
        return torch.autocast(device_type=device, dtype=_torch_dtype(compute))
    if spec.task.is_peft and compute in (DType.BF16, DType.FP16):
        # peft keeps adapters in fp32; autocast runs them in the compute dtype, as Trainer does.
        return torch.autocast(device_type=device, dtype=_torch_dtype(compute))
    return nullcontext()


def _optimizer(spec: JobSpec, params: list[Any]) -> tuple[Any, str]:
    import torch

    opt = spec.optimizer
    lr = 1e-5
    if opt is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=lr), "torch.optim.AdamW"
    if opt is Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=0.9), "torch.optim.SGD(momentum=0.9)"
    if opt is Optimizer.ADAFACTOR:
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=lr, scale_parameter=False, relative_step=False
        ), "transformers Adafactor"
    if opt in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT):
        import bitsandbytes as bnb

        if opt is Optimizer.PAGED_ADAMW_8BIT:
            return bnb.optim.PagedAdamW8bit(params, lr=lr), "bitsandbytes PagedAdamW8bit"
        return bnb.optim.AdamW8bit(params, lr=lr), "bitsandbytes AdamW8bit"
    return None, "none (forward/backward only)"


def _lora_targets(model: Any, target: str) -> list[str]:
    """peft ``target_modules`` (module-name suffixes) for a snugfit ``lora_target``.

    Linear-like means ``nn.Linear`` or GPT-2's ``Conv1D``; fused projections (GPT-2
    ``c_attn``, Phi-3 ``qkv_proj``) are adapted whole, as peft users do.
    """
    import torch
    from transformers.pytorch_utils import Conv1D

    names: set[str] = set()
    for full, module in model.named_modules():
        leaf = full.rsplit(".", 1)[-1]
        if not isinstance(module, torch.nn.Linear | Conv1D) or not full:
            continue
        if leaf in ("lm_head", "score", "decoder") or full.endswith("pooler.dense"):
            continue
        names.add(leaf)
    if target == "all_linear":
        return sorted(names)
    qv = {"q_proj", "v_proj", "query", "value", "c_attn", "qkv_proj"}
    if target == "qv":
        return sorted(names & qv)
    attention = sorted(names & (qv | {"k_proj", "o_proj", "key"}))
    if "c_attn" in names:
        attention.append("attn.c_proj")  # GPT-2's output projection; mlp.c_proj is the MLP
    if "query" in names:
        attention.append("attention.output.dense")  # BERT's output projection
    return attention


def _fused_expert_params(model: Any) -> list[str]:
    """Names (as peft ``target_parameters``) of fused 3-D expert weights.

    Recent transformers store all experts of a layer in one ``(experts, out, in)`` parameter,
    which no ``nn.Linear`` name matches; peft adapts such parameters directly. Its fused
    gate/up adapter has fewer parameters than per-matrix adapters, so rows also carry the
    catalogue count (``lora_params_arch``) next to the built one (``params_trainable``).
    """
    found = set()
    for name, p in model.named_parameters():
        parts = name.split(".")
        if p.dim() == 3 and len(parts) >= 2 and "expert" in parts[-2]:
            found.add(".".join(parts[-2:]))
    return sorted(found)


# ------------------------------------------------------------------------- the runs
def _train(spec: JobSpec, model: Any, device: str, out: Outcome) -> None:
    import torch

    arch = spec.arch
    if spec.task.is_peft:
        import peft

        if spec.task is Task.QLORA:
            model = peft.prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=bool(spec.gradient_checkpointing)
            )
        assert spec.lora_rank is not None and spec.lora_target is not None
        targets = _lora_targets(model, spec.lora_target.value)
        expert_params = (
            _fused_expert_params(model) if spec.lora_target.value == "all_linear" else []
        )
        extra: dict[str, Any] = {"target_parameters": expert_params} if expert_params else {}
        cfg = peft.LoraConfig(
            r=spec.lora_rank,
            lora_alpha=2 * spec.lora_rank,
            lora_dropout=0.0,
            target_modules=targets,
            task_type=None,
            **extra,
        )
        model = peft.get_peft_model(model, cfg)
        out["lora_target_modules"] = targets + expert_params
        out["lora_params_arch"] = spec.arch.lora_params(spec.lora_rank, spec.lora_target.value)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "config"):
        model.config.use_cache = False
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    out["params_trainable"] = sum(p.numel() for p in params)
    optimizer, out["optimizer_impl"] = _optimizer(spec, params)
    model_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    assert spec.seq_len is not None and spec.steps is not None
    assert spec.gradient_accumulation is not None
    steps = min(spec.steps, MAX_TRAIN_STEPS)
    # At least one timed step after warm-up, even for a 1-step spec.
    steps = max(steps, TRAIN_WARMUP_STEPS + 1)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(
        1, arch.vocab_size, (spec.batch_size, spec.seq_len), device=device, generator=gen
    )
    times: list[float] = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        for _micro in range(spec.gradient_accumulation):
            with _autocast(spec, device, model_dtype):
                loss = model(input_ids=ids, labels=ids).loss
            (loss / spec.gradient_accumulation).backward()
        # The spec says whether the loop frees its gradients (torch >= 2.0) or zeroes them.
        to_none = spec.zero_grad_set_to_none is not False
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=to_none)
        else:
            model.zero_grad(set_to_none=to_none)
        _sync(device)
        times.append(time.perf_counter() - t0)
    timed = times[TRAIN_WARMUP_STEPS:]
    out["step_time_s"] = statistics.median(timed)
    out["step_times_s"] = [round(t, 6) for t in times]
    out["steps_run"] = steps
    out["loss"] = float(loss.detach().float().cpu())
    if steps == spec.steps:
        out["runtime_s"] = sum(times)


class _TokenClock:
    """A logits processor that timestamps each generated token (generate() calls it once per
    token, right after that token's forward pass)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        _sync(self.device)
        self.stamps.append(time.perf_counter())
        return scores


def _infer(spec: JobSpec, model: Any, device: str, out: Outcome) -> None:
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    arch = spec.arch
    assert spec.input_len is not None and spec.output_len is not None
    model.eval()
    model_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    gen = torch.Generator(device=device).manual_seed(0)

    def ids(batch: int, length: int) -> Any:
        return torch.randint(1, arch.vocab_size, (batch, length), device=device, generator=gen)

    if arch.encoder_only:
        with torch.inference_mode(), _autocast(spec, device, model_dtype):
            model(input_ids=ids(1, 8))  # warm-up
            x = ids(spec.batch_size, spec.input_len)
            _sync(device)
            t0 = time.perf_counter()
            model(input_ids=x)
            _sync(device)
        out["ttft_s"] = time.perf_counter() - t0
        out["notes"].append("encoder-only: one forward pass, no decode")
        if spec.num_requests == spec.batch_size:
            out["runtime_s"] = out["ttft_s"]
        return

    def generate(x: Any, new_tokens: int, clock: _TokenClock | None) -> None:
        cfg = GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            eos_token_id=None,
            bos_token_id=0,
        )
        procs = LogitsProcessorList([clock] if clock is not None else [])
        with torch.inference_mode(), _autocast(spec, device, model_dtype):
            model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                generation_config=cfg,
                logits_processor=procs,
            )

    generate(ids(1, 8), 2, None)  # warm-up: kernels, cuBLAS handles, generate's own set-up
    x = ids(spec.batch_size, spec.input_len)
    clock = _TokenClock(device)
    _sync(device)
    t0 = time.perf_counter()
    generate(x, spec.output_len, clock)
    _sync(device)
    total = time.perf_counter() - t0
    if not clock.stamps:
        raise RuntimeError("generate() produced no tokens; cannot time TTFT/TPOT")
    out["ttft_s"] = clock.stamps[0] - t0
    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    if gaps:
        out["tpot_s"] = statistics.median(gaps)
    out["tokens_generated"] = len(clock.stamps)
    if spec.num_requests == spec.batch_size:
        out["runtime_s"] = total
    else:
        out["notes"].append(
            f"one batch of {spec.batch_size} timed; runtime_s left null for num_requests="
            f"{spec.num_requests}"
        )


@contextmanager
def _nvml_peak(nvml: Nvml | None, index: int | None) -> Iterator[PeakSampler | None]:
    if nvml is None or index is None:
        yield None
        return
    with PeakSampler(nvml, (index,)) as sampler:
        yield sampler


@dataclass
class _Probe:
    """This process's GPU as NVML sees it: the handle, its NVML index (None when it cannot be
    matched) and each device's memory in use before this process touched CUDA."""

    nvml: Nvml | None = None
    index: int | None = None
    idle_used: dict[int, int] = field(default_factory=dict)


def run_job(spec_dict: dict[str, Any], device: str = "auto") -> Outcome:
    """Run one job; never raises. ``status`` is ok | oom | skipped | error."""
    out: Outcome = {"status": "error", "message": None, "notes": []}
    try:
        spec = parse_spec(spec_dict)
        import torch

        device = _resolve_device(device)
        out["device"] = device
        check_supported(spec, device)
    except UnsupportedJob as exc:
        out.update(status="skipped", message=str(exc))
        return out
    except Exception as exc:
        out.update(status="error", message=f"{type(exc).__name__}: {exc}")
        return out

    probe = _open_cuda(out) if device == "cuda" else _Probe()
    out.update(environment(device, probe.nvml, probe.index))
    torch.manual_seed(0)

    t_start = time.perf_counter()
    sampler: PeakSampler | None = None
    try:
        with _nvml_peak(probe.nvml, probe.index) as sampler:
            _build_and_run(spec, device, out, sampler)
        out["status"] = "ok"
    except UnsupportedJob as exc:
        out.update(status="skipped", message=str(exc))
    except BaseException as exc:
        if _is_oom(exc):
            out.update(status="oom", message=f"{type(exc).__name__}: {str(exc)[:300]}")
        else:
            tb = traceback.format_exc(limit=6)
            out.update(status="error", message=f"{type(exc).__name__}: {exc}\n{tb}"[:4000])
    out["wall_s"] = time.perf_counter() - t_start
    _record_peaks(out, device, probe, sampler)
    return out


def _open_cuda(out: Outcome) -> _Probe:
    """Create the CUDA context and find its device in NVML; the context's own cost to ``out``."""
    import torch

    probe = _Probe(nvml=open_nvml())
    nvml = probe.nvml
    if nvml is not None:
        # Read before this process touches CUDA: whatever is used now is not the job's.
        probe.idle_used = {i: nvml.memory_used_bytes(i) for i in range(nvml.device_count())}
    torch.cuda.init()
    torch.empty(1, device="cuda")  # creates the primary context
    torch.cuda.synchronize()
    if nvml is not None:
        uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
        index = index_for_uuid(nvml, uuid) if uuid else None
        if index is None and nvml.device_count() == 1:
            index = 0
        probe.index = index
        if index is not None:
            ctx = nvml.memory_used_bytes(index) - probe.idle_used.get(index, 0)
            out["cuda_context_gib"] = ctx / GIB
            out["nvml_idle_used_gib"] = probe.idle_used.get(index, 0) / GIB
    return probe


def _build_and_run(spec: JobSpec, device: str, out: Outcome, sampler: PeakSampler | None) -> None:
    """Build the model and run the job's training steps or inference into ``out``."""
    import torch

    t0 = time.perf_counter()
    model, precision = _build(spec, device)
    _sync(device)
    out["model_build_s"] = time.perf_counter() - t0
    if spec.weight_dtype in (DType.INT8, DType.NF4, DType.INT4) and device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if sampler is not None:
            sampler.reset()
        out["notes"].append(
            "quantised model: peaks measured from after the bf16 build and layer-wise "
            "quantisation (a checkpoint load never holds the bf16 copy)"
        )
    out["precision"] = precision
    out["attn_implementation"] = attn_implementation(spec.arch)
    out["params_built"] = sum(p.numel() for p in model.parameters())
    out["params_arch"] = spec.arch.total_params()
    if spec.task.is_training:
        _train(spec, model, device, out)
    else:
        _infer(spec, model, device, out)


def _record_peaks(out: Outcome, device: str, probe: _Probe, sampler: PeakSampler | None) -> None:
    """The run's memory high-water marks: torch's and NVML's on a GPU (NVML's less what was
    in use before, the job's peak), the process's max RSS on a CPU. Closes NVML."""
    if device == "cuda":
        import torch

        out["torch_max_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["torch_max_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        index = probe.index
        if sampler is not None and sampler.peak_bytes is not None and index is not None:
            out["nvml_peak_used_gib"] = sampler.peak_bytes / GIB
            out["nvml_samples"] = sampler.n_samples
            out["peak_vram_gib"] = (sampler.peak_bytes - probe.idle_used.get(index, 0)) / GIB
        if probe.nvml is not None:
            probe.nvml.close()
    else:
        # ru_maxrss is KiB on Linux: the host-memory high-water mark of this child process.
        out["cpu_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
