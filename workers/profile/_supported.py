"""What the profiling harness can run faithfully: a job it cannot raises :class:`UnsupportedJob`
before any model is built, with what to change."""

from __future__ import annotations

from predictor.spec import DType, Head, JobSpec, Optimizer, Task
from workers.profile._model import UnsupportedJob

__all__ = ["check_supported"]


def _has_bnb() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # an install without CUDA libraries fails at import with OSError/RuntimeError
        return False
    return True


# JobSpec fields that describe a program other than the harness's own.
_OTHER_PROGRAM = (
    "torch_version",
    "transformers_version",
    "use_cache",
    "kv_cache_max_len",
    "kv_cache_query_heads",
)


def check_supported(spec: JobSpec, device: str) -> None:
    """Raise UnsupportedJob for what this harness cannot run faithfully on ``device``."""
    needs_bnb = (
        spec.weight_dtype in (DType.INT8, DType.NF4, DType.INT4)
        or spec.task is Task.QLORA
        or spec.optimizer in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT)
    )
    if needs_bnb and not _has_bnb():
        raise UnsupportedJob(
            "needs bitsandbytes (8-bit optimizer or 4/8-bit weights), which is not installed; "
            "`pip install bitsandbytes` on a CUDA machine to measure it"
        )
    if needs_bnb and device == "cpu":
        raise UnsupportedJob("bitsandbytes 8-bit/4-bit paths need a CUDA device")
    if spec.weight_dtype in (DType.FP8, DType.FP4) or spec.compute_dtype in (DType.FP8, DType.FP4):
        raise UnsupportedJob(
            f"fp8/fp4 ({spec.weight_dtype}/{spec.compute_dtype}) has no Hugging Face eager path "
            "in this harness; profile it with vLLM/TensorRT-LLM or Transformer Engine"
        )
    if spec.n_gpus != 1:
        raise UnsupportedJob(f"the profiler runs single-GPU jobs; got n_gpus={spec.n_gpus}")
    other = [f for f in _OTHER_PROGRAM if getattr(spec, f) is not None]
    if spec.head is Head.CLASSIFICATION:
        other.insert(0, "head")
    if other:
        raise UnsupportedJob(
            "the harness trains an LM head on its own torch and transformers, with HF's growing "
            f"KV cache; `{other[0]}` (got {getattr(spec, other[0])!r}) describes another "
            "program: drop it to measure this harness's"
        )
    if not spec.task.is_training and spec.kv_cache_dtype != spec.compute_dtype:
        raise UnsupportedJob(
            f"HF's KV cache is stored in the compute dtype ({spec.compute_dtype}); "
            f"kv_cache_dtype={spec.kv_cache_dtype} needs a serving engine"
        )
    arch = spec.arch
    length = (
        spec.seq_len
        if spec.task.is_training
        else (spec.input_len or 0) + (0 if arch.encoder_only else (spec.output_len or 0))
    )
    if arch.position == "learned" and length is not None and length > arch.max_position_embeddings:
        raise UnsupportedJob(
            f"{arch.name} has {arch.max_position_embeddings} learned positions; the job needs "
            f"{length}. Shorten seq_len/input_len+output_len"
        )
