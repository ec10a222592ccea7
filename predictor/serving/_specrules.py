"""Validation and documented defaults of ``task: "serve"`` specs.

Defaults: ``framework`` vllm; ``n_gpus`` = ``tensor_parallel`` (one replica; the planner
chooses how many); ``slo_ttft_s``/``slo_tpot_s`` the MLPerf interactive tier of the model's size
when *unset* (an explicit ``null`` means no target on that metric); ``max_model_len`` =
``min(model context, max(4096, 2 × (input_len + output_len)))``; ``allowed_weight_dtypes`` =
``[weight_dtype]`` (quantisation is the user's call on quality). A ``batch_size`` above 1
caps the running batch (``--max-num-seqs``); otherwise the planner sizes it from the KV cache.
``tensor_parallel`` above 1 pins the TP size. An unset ``kv_cache_dtype`` follows each planned
weight format (fp8 for fp8/fp4 checkpoints, else bf16).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import SpecError
from ..gpus import get_gpu
from ..spec import DType, Framework
from ._perf import dtype_support
from ._slo import default_slo

if TYPE_CHECKING:
    from ..spec import JobSpec

__all__ = ["SERVE_FRAMEWORKS", "check_serve_spec", "weight_options"]

SERVE_FRAMEWORKS = (Framework.VLLM, Framework.SGLANG, Framework.TRTLLM, Framework.HF)
_SERVE_KV = (DType.BF16, DType.FP16, DType.FP8)


def _positive(name: str, value: Any, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"`{name}` must be a number; got {value!r}. Example: {example}")
    if value <= 0:
        raise SpecError(f"`{name}` must be > 0; got {value!r}. Example: {example}")


def weight_options(spec: JobSpec) -> tuple[DType, ...]:
    """The weight formats the planner may use for ``spec``."""
    if spec.allowed_weight_dtypes:
        return tuple(spec.allowed_weight_dtypes)
    return (spec.weight_dtype or DType.BF16,)


def check_serve_spec(spec: JobSpec, set_: Callable[[str, Any], None]) -> None:
    given = spec.model_fields_set
    if spec.framework is None:
        set_("framework", Framework.VLLM)
    elif spec.framework not in SERVE_FRAMEWORKS:
        raise SpecError(
            f"`framework` {spec.framework.value!r} cannot serve a `serve` deployment; use one of "
            f"{', '.join(f.value for f in SERVE_FRAMEWORKS)}"
        )
    if spec.request_rate is None:
        raise SpecError("`request_rate` is required for `serve` jobs (requests/s, e.g. 2.0)")
    _positive("request_rate", spec.request_rate, "`request_rate: 2.0` (requests per second)")
    for name in ("slo_ttft_s", "slo_tpot_s", "duration_s"):
        value = getattr(spec, name)
        if value is not None:
            _positive(name, value, f"`{name}: 0.5`, or null for no limit")
    if spec.pipeline_parallel != 1:
        raise SpecError(
            f"`pipeline_parallel` must be 1 for `serve` jobs; got {spec.pipeline_parallel}. "
            "Use `tensor_parallel` within a node"
        )
    if "n_gpus" in given and spec.n_gpus != spec.tensor_parallel:
        raise SpecError(
            f"`n_gpus` of a `serve` job is one replica's GPUs and must equal `tensor_parallel`; "
            f"got n_gpus={spec.n_gpus}, tensor_parallel={spec.tensor_parallel}. Drop `n_gpus` "
            "(the planner chooses the replicas) or pin `tensor_parallel`"
        )
    set_("n_gpus", spec.tensor_parallel)

    arch = spec.arch
    if arch.encoder_only:
        raise SpecError(
            f"`model` {arch.name} is encoder-only and generates no tokens; `serve` plans text "
            "generation. Use task `inference` for embedding or classification jobs"
        )
    tier = default_slo(arch.n_active_params_b)
    if "slo_ttft_s" not in given:
        set_("slo_ttft_s", tier.ttft_s)
    if "slo_tpot_s" not in given:
        set_("slo_tpot_s", tier.tpot_s)

    assert spec.input_len is not None and spec.output_len is not None
    need = spec.input_len + spec.output_len
    ctx = arch.max_position_embeddings
    if spec.max_model_len is None:
        set_("max_model_len", min(ctx, max(4096, 2 * need)))
    else:
        _positive("max_model_len", spec.max_model_len, "`max_model_len: 8192`")
        if spec.max_model_len < need:
            raise SpecError(
                f"`max_model_len` {spec.max_model_len} is shorter than input_len + output_len = "
                f"{need}; raise it to at least {need}"
            )
    assert spec.max_model_len is not None
    if need > ctx or spec.max_model_len > ctx:
        raise SpecError(
            f"`max_model_len` {max(need, spec.max_model_len)} exceeds the {ctx}-token context "
            f"of {arch.name}; lower `max_model_len`, `input_len` or `output_len`"
        )

    weight = spec.weight_dtype
    allowed = spec.allowed_weight_dtypes
    if allowed is not None:
        if not allowed:
            raise SpecError("`allowed_weight_dtypes` is empty; list at least one, e.g. ['bf16']")
        if weight is not None and "weight_dtype" in given and weight not in allowed:
            raise SpecError(
                f"`weight_dtype` {weight.value} is not in `allowed_weight_dtypes` "
                f"{[d.value for d in allowed]}; add it or drop `weight_dtype`"
            )
        if weight is None:
            set_("weight_dtype", allowed[0])
    kv = spec.kv_cache_dtype
    if kv is not None and kv not in _SERVE_KV:
        raise SpecError(
            f"`kv_cache_dtype` {kv.value} is not offered by serving engines; use bf16, fp16 or fp8"
        )
    if spec.gpu is not None:
        gpu = get_gpu(spec.gpu)
        fw = spec.framework or Framework.VLLM
        weights = weight_options(spec) if allowed is not None else (weight or DType.BF16,)
        reasons = [dtype_support(gpu, d, fw) for d in weights]
        if all(reasons):
            fix = "use fp8 or bf16" if DType.FP4 in weights else "use bf16"
            if DType.FP4 in weights:
                fix += ", or pin `gpu: B200-180GB`"
            raise SpecError(
                f"`weight_dtype` {'/'.join(d.value for d in weights)} cannot serve on the pinned "
                f"`gpu` {spec.gpu}: {reasons[0]}; {fix}"
            )
