"""Enumerate the deployment shapes a ``serve`` spec may use: slot × TP × weight × KV dtype.

A shape is a whole-GPU type with tensor parallelism 1, 2, 4 or 8 (one NVLink node), or a MIG
slice at TP 1 (MIG instances share no NVLink, so a replica never spans slices). ``--gpu`` or a
pinned ``gpu``, ``tensor_parallel`` > 1 or ``weight_dtype`` narrows the set. Shapes that cannot run
(dtype unsupported, KV heads not divisible) are returned with the reason instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..gpus import GPU_NAMES, get_gpu
from ..spec import DType, JobSpec
from ._perf import Slot, dtype_support
from ._specrules import weight_options

__all__ = ["TP_SIZES", "Shape", "enumerate_shapes"]

TP_SIZES: tuple[int, ...] = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Shape:
    slot: Slot
    tp: int
    weight: DType
    kv: DType

    @property
    def label(self) -> str:
        where = (
            self.slot.gpu.name
            if self.slot.mig is None
            else (f"{self.slot.gpu.name} MIG {self.slot.mig.name}")
        )
        return f"{where} TP{self.tp} {self.weight.value}/kv-{self.kv.value}"


def _kv_for(spec: JobSpec, weight: DType) -> DType:
    # An explicit kv_cache_dtype holds for every option; otherwise the cache follows the
    # checkpoint: fp8/fp4 checkpoints (ModelOpt, as in the TRT-LLM perf overview) ship an fp8
    # KV cache, 16-bit ones keep a bf16 cache.
    if spec.kv_cache_dtype is not None:
        return spec.kv_cache_dtype
    return DType.FP8 if weight in (DType.FP8, DType.FP4) else DType.BF16


def enumerate_shapes(
    spec: JobSpec, gpus: Sequence[str] | None = None
) -> tuple[list[Shape], list[tuple[str, str]]]:
    """Runnable shapes, and ``(label, reason)`` for the ones that cannot run."""
    names = [spec.gpu] if spec.gpu else list(gpus or GPU_NAMES)
    # TP > 1 pins the shape; TP 1 is the default (and what a dumped spec carries), so it
    # leaves every TP size open.
    tps = (spec.tensor_parallel,) if spec.tensor_parallel > 1 else TP_SIZES
    arch = spec.arch
    fw = spec.framework
    assert fw is not None
    shapes: list[Shape] = []
    skipped: list[tuple[str, str]] = []
    for name in names:
        gpu = get_gpu(name)
        slots = [(Slot(gpu), tp) for tp in tps]
        if 1 in tps:
            slots += [(Slot(gpu, p), 1) for p in gpu.mig_profiles if p.compute_slices < 7]
        for slot, tp in slots:
            for weight in weight_options(spec):
                shape = Shape(slot, tp, weight, _kv_for(spec, weight))
                why = dtype_support(gpu, weight, fw) or dtype_support(gpu, shape.kv, fw, kv=True)
                if not why and tp > 1 and arch.n_kv_heads % tp and tp % arch.n_kv_heads:
                    why = f"TP{tp} cannot split the {arch.n_kv_heads} KV heads of {arch.name}"
                if why:
                    if slot.mig is None:
                        skipped.append((shape.label, why))
                    continue
                shapes.append(shape)
    return shapes, skipped
