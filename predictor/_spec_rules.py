"""The cross-field rules of a JobSpec: which fields apply to which task, their documented
defaults, the framework-dependent fidelity defaults, dtypes and the parallel layout.

Each function takes the spec the ``after`` validator is still building and fills or checks it
in place (the model is frozen, so fills go through ``object.__setattr__``).
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ._spec_types import DType, Framework, LoraTarget, Optimizer, Task
from .exceptions import SpecError
from .gpus import GPU_NAMES
from .models import ModelArch, resolve_model

if TYPE_CHECKING:
    from .spec import JobSpec

__all__ = [
    "TASK_DEFAULTS",
    "check_kv_cache",
    "check_layout",
    "check_serve",
    "check_training_dtypes",
    "fill_dtypes",
    "fill_fidelity_defaults",
    "fill_task_defaults",
    "reject_inapplicable",
    "resolve_arch",
    "saves_softmax_input",
    "shifts_fp32_logits",
]

_TRAINING_FIDELITY = (
    "activation_offload",
    "chunked_loss",
    "zero_grad_set_to_none",
    "head",
    "torch_version",
    "transformers_version",
    "use_cache",
)
_INFERENCE_ONLY = (
    "input_len",
    "output_len",
    "num_requests",
    "kv_cache_dtype",
    "kv_cache_max_len",
    "kv_cache_query_heads",
)
_TRAINING_ONLY = (
    "seq_len",
    "steps",
    "gradient_accumulation",
    "optimizer",
    "gradient_checkpointing",
    "zero_stage",
    *_TRAINING_FIDELITY,
)
_PEFT_ONLY = ("lora_rank", "lora_target", "adapter_dtype", "lora_dropout")
_SERVE_ONLY = (
    "request_rate",
    "slo_ttft_s",
    "slo_tpot_s",
    "max_model_len",
    "allowed_weight_dtypes",
    "duration_s",
)

# Documented defaults, applied only to fields that apply to the task.
TASK_DEFAULTS: dict[str, Any] = {
    "input_len": 512,
    "output_len": 256,
    "seq_len": 2048,
    "steps": 1000,
    "gradient_accumulation": 1,
    "optimizer": Optimizer.ADAMW,
    "gradient_checkpointing": False,
    "zero_stage": 0,
    "activation_offload": False,
    "lora_rank": 16,
    "lora_target": LoraTarget.ALL_LINEAR,
}


def _model_key(model: str | dict[str, Any]) -> str:
    return model if isinstance(model, str) else "\x00" + json.dumps(model, sort_keys=True)


@lru_cache(maxsize=4096)
def _resolve_cached(key: str) -> ModelArch:
    # Keyed by the JSON text so explicit-architecture dicts cache too; catalogue lookups and
    # config.json reads then happen once per distinct model, not once per job.
    if key.startswith("\x00"):
        return resolve_model(json.loads(key[1:]))
    return resolve_model(key)


def _default_compute(weight: DType) -> DType:
    # Weight-only quantisation (int8/int4/nf4) dequantises into bf16 matmuls; fp8/fp4 weights
    # imply the low-precision tensor-core path on GPUs that have it.
    if weight in (DType.FP32, DType.BF16, DType.FP16, DType.FP8, DType.FP4):
        return weight
    return DType.BF16


def resolve_arch(model: str | dict[str, Any]) -> ModelArch:
    """The architecture of a spec's ``model``, resolved once per distinct model."""
    return _resolve_cached(_model_key(model))


def check_serve(spec: JobSpec) -> None:
    """Validate and fill a ``serve`` spec in place (the frozen model is still being built).

    The rules and defaults live in :mod:`predictor.serving._specrules` so the spec stays a
    thin contract; that module imports nothing from here at import time.
    """
    from .serving._specrules import check_serve_spec

    check_serve_spec(spec, lambda name, value: object.__setattr__(spec, name, value))


def saves_softmax_input(spec: JobSpec) -> bool:
    """Whether the job's torch keeps softmax's input for backward: releases before 1.11
    (pytorch#65242 made the backward read only the output; it landed in October 2021, after
    the 1.10 branch, pytorch/xla#3150 following its new signature on 2021-10-04)."""
    if spec.torch_version is None:
        return False
    major, minor = (int(x) for x in spec.torch_version.split(".")[:2])
    return (major, minor) < (1, 11)


def check_kv_cache(spec: JobSpec) -> None:
    """A preallocated KV cache (``kv_cache_max_len``) holds every token the job generates; a
    `serve` deployment's engine sizes its own cache (by memory fraction), so neither field
    applies there."""
    for f in ("kv_cache_max_len", "kv_cache_query_heads"):
        if spec.task is Task.SERVE and getattr(spec, f) is not None:
            raise SpecError(
                f"`{f}` does not apply to `serve` deployments (got {getattr(spec, f)!r}); the "
                "serving engine sizes its KV cache itself: drop the field"
            )
    n = spec.kv_cache_max_len
    if n is None or spec.input_len is None or spec.output_len is None:
        return
    need = spec.input_len + spec.output_len
    if n < need:
        raise SpecError(
            f"`kv_cache_max_len` {n} is below `input_len` + `output_len` = {need}: a cache "
            f"preallocated for {n} tokens cannot hold the job's tokens; set it to at least "
            f"{need} (the length the program allocates, e.g. the model's max_seq_len), or "
            "drop it for a cache that grows"
        )


def shifts_fp32_logits(spec: JobSpec) -> bool:
    """Whether the job's transformers computes a Llama causal-LM loss on a shifted fp32 copy of
    the logits: releases before 4.50. Read in the code: v4.31.0 ``models/llama/modeling_llama.py``
    lines 825-838 (``logits = logits.float()``, then ``shift_logits = logits[..., :-1,
    :].contiguous()``), the same in v4.46.0 and v4.48.0 ``loss/loss_utils.py``
    ``ForCausalLMLoss``; v4.50.0's pads the labels and shifts them instead (4.49 not read, taken
    as the older code: the larger of the two)."""
    if spec.transformers_version is None:
        return False
    major, minor = (int(x) for x in spec.transformers_version.split(".")[:2])
    if (major, minor) >= (4, 50):
        return False
    from .arch_to_hf import hf_family
    from .exceptions import UnmappedArchError

    try:  # only Llama's loss at those releases was read: other families trace as today's
        return hf_family(spec.arch) == "llama"
    except UnmappedArchError:
        return False


def reject_inapplicable(spec: JobSpec) -> None:
    """SpecError for the first field set that does not apply to the spec's task."""
    task = spec.task
    inapplicable: list[str] = []
    if task is not Task.SERVE:
        inapplicable += [f for f in _SERVE_ONLY if getattr(spec, f) is not None]
    else:
        inapplicable += [f for f in ("num_requests", "depends_on") if getattr(spec, f) is not None]
    if task.is_training:
        inapplicable += [f for f in _INFERENCE_ONLY if getattr(spec, f) is not None]
        if not task.is_peft:
            inapplicable += [f for f in _PEFT_ONLY if getattr(spec, f) is not None]
    else:
        inapplicable += [f for f in _TRAINING_ONLY + _PEFT_ONLY if getattr(spec, f) is not None]
    if inapplicable:
        f = inapplicable[0]
        fix = {
            "seq_len": "for inference give `input_len` and `output_len`",
            "output_len": "training jobs use `seq_len`",
            "input_len": "training jobs use `seq_len`",
            "lora_rank": "use task `lora` or `qlora`, or drop the field",
            "lora_target": "use task `lora` or `qlora`, or drop the field",
            "lora_dropout": "use task `lora` or `qlora`, or drop the field",
            "num_requests": "a `serve` deployment takes `request_rate` and `duration_s`",
            "depends_on": "a deployment is planned when submitted; submit it once its "
            "parents have succeeded",
        }.get(f, "use task `serve`, or drop the field" if f in _SERVE_ONLY else "remove it")
        raise SpecError(
            f"`{f}` does not apply to `{task.value}` jobs (got {getattr(spec, f)!r}); {fix}"
        )


def fill_task_defaults(spec: JobSpec) -> None:
    """:data:`TASK_DEFAULTS` for the unset fields that apply to the spec's task."""
    task = spec.task
    applicable = (
        _TRAINING_ONLY + (_PEFT_ONLY if task.is_peft else ())
        if task.is_training
        else _INFERENCE_ONLY
    )
    for f in applicable:
        if getattr(spec, f) is None and f in TASK_DEFAULTS:
            object.__setattr__(spec, f, TASK_DEFAULTS[f])


def fill_fidelity_defaults(spec: JobSpec) -> None:
    """Defaults that depend on the framework, documented in the README ("Predicting")."""
    task, fw = spec.task, spec.framework
    if spec.compile is None:
        # torchtune and HF run eagerly unless told otherwise; Unsloth's kernels are compiled.
        object.__setattr__(spec, "compile", fw is Framework.UNSLOTH)
    if not task.is_training:
        return
    if task is Task.QLORA and "gradient_checkpointing" not in spec._explicit:
        # peft's prepare_model_for_kbit_training (and torchtune's QLoRA recipes) turn it on.
        object.__setattr__(spec, "gradient_checkpointing", True)
    if spec.chunked_loss is None:
        object.__setattr__(spec, "chunked_loss", fw in (Framework.TORCHTUNE, Framework.UNSLOTH))
    if task.is_peft and spec.adapter_dtype is None:
        fp32 = fw in (None, Framework.HF, Framework.PEFT, Framework.OTHER)
        compute = spec.compute_dtype or DType.BF16
        if compute not in (DType.FP32, DType.BF16, DType.FP16):
            compute = DType.BF16  # fp8/fp4 recipes keep their adapters in bf16
        object.__setattr__(spec, "adapter_dtype", DType.FP32 if fp32 else compute)
    if spec.adapter_dtype is not None and spec.adapter_dtype not in (
        DType.FP32,
        DType.BF16,
        DType.FP16,
    ):
        raise SpecError(
            f"`adapter_dtype` must be fp32, bf16 or fp16; got {spec.adapter_dtype.value}"
        )


def fill_dtypes(spec: JobSpec) -> None:
    """Weight, compute and KV-cache dtypes and ``num_requests`` from the task's defaults."""
    task = spec.task
    weight = spec.weight_dtype or (DType.NF4 if task is Task.QLORA else DType.BF16)
    object.__setattr__(spec, "weight_dtype", weight)
    if spec.compute_dtype is None:
        object.__setattr__(spec, "compute_dtype", _default_compute(weight))
    _fill_double_quant(spec, weight)
    if not task.is_training:
        # A serve spec's unset KV dtype follows each planned weight format (serving._options).
        if spec.kv_cache_dtype is None and task is not Task.SERVE:
            kv = spec.compute_dtype if spec.compute_dtype != DType.FP4 else DType.FP8
            object.__setattr__(spec, "kv_cache_dtype", kv)
        if spec.num_requests is None and task is Task.INFERENCE:
            object.__setattr__(spec, "num_requests", spec.batch_size)


def _fill_double_quant(spec: JobSpec, weight: DType) -> None:
    """``double_quant`` applies to nf4 weights only. Unset: torchao's NF4 (torchtune) and
    Unsloth's loader quantise the scales again; bitsandbytes / transformers default to not."""
    if weight is not DType.NF4:
        if spec.double_quant is not None:
            raise SpecError(
                f"`double_quant` applies to nf4 weights (bitsandbytes, torchao); got "
                f"weight_dtype {weight.value}. Drop the field or set weight_dtype nf4"
            )
        return
    if spec.double_quant is None and spec.task is not Task.SERVE:
        dq = spec.framework in (Framework.TORCHTUNE, Framework.UNSLOTH)
        object.__setattr__(spec, "double_quant", dq)


def check_training_dtypes(spec: JobSpec) -> None:
    """SpecError for a QLoRA base model that is not 4-bit, or training in an integer dtype."""
    task, weight = spec.task, spec.weight_dtype
    assert weight is not None  # filled by fill_dtypes
    if task is Task.QLORA and weight not in (DType.NF4, DType.INT4, DType.FP4):
        raise SpecError(
            f"`qlora` keeps a 4-bit base model; `weight_dtype` must be nf4, int4 or fp4, "
            f"got {weight.value}. Use task `lora` for {weight.value} weights"
        )
    if task.is_training and spec.compute_dtype in (DType.INT8, DType.INT4, DType.NF4):
        raise SpecError(
            f"training cannot compute in {spec.compute_dtype}; set `compute_dtype` to "
            "bf16, fp16, fp32 or fp8"
        )


def check_layout(spec: JobSpec) -> None:
    """SpecError for a parallel layout, GPU type or command the job cannot run with."""
    model_parallel = spec.tensor_parallel * spec.pipeline_parallel
    if spec.n_gpus % spec.tensor_parallel:
        raise SpecError(
            f"`tensor_parallel` must divide `n_gpus`; got {spec.tensor_parallel} and {spec.n_gpus}"
        )
    if spec.n_gpus % model_parallel:
        raise SpecError(
            f"`tensor_parallel` × `pipeline_parallel` must divide `n_gpus`; got "
            f"{spec.tensor_parallel} × {spec.pipeline_parallel} = {model_parallel} and "
            f"{spec.n_gpus}"
        )
    if spec.gpu is not None and spec.gpu not in GPU_NAMES:
        hint = difflib.get_close_matches(spec.gpu, GPU_NAMES, n=1)
        did = f"did you mean {hint[0]!r}? " if hint else ""
        raise SpecError(
            f"`gpu` {spec.gpu!r} is not a catalogue GPU type; {did}"
            f"use one of {', '.join(GPU_NAMES)}"
        )
    if spec.command is not None and not spec.command:
        raise SpecError("`command` must be a non-empty argv list, e.g. ['python', 'train.py']")

    arch = resolve_arch(spec.model)
    if (
        spec.tensor_parallel > 1
        and arch.n_kv_heads % spec.tensor_parallel
        and (spec.tensor_parallel % arch.n_kv_heads)
    ):
        raise SpecError(
            f"`tensor_parallel` {spec.tensor_parallel} cannot split {arch.n_kv_heads} KV heads "
            f"of {arch.name}; use a divisor or multiple of {arch.n_kv_heads}"
        )
    if arch.n_layers < spec.pipeline_parallel:
        raise SpecError(
            f"`pipeline_parallel` {spec.pipeline_parallel} exceeds the {arch.n_layers} layers "
            f"of {arch.name}"
        )
