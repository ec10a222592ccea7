"""Host (CPU) memory a job needs on its node, estimated from its spec.

The scheduler reserves host memory as well as GPU memory. Unset, a job's reservation is its
node's share per GPU (``scheduler.core.host``), raised to this estimate where the estimate is
larger; a spec's ``host_memory_gib`` overrides both. The estimate is the node total, GiB, for
all the job's ranks (a job's gang sits in one node):

* **process baseline** per rank: the Python interpreter with torch and transformers imported,
  the CUDA runtime's host-side state and data-loader workers (``process_gib``);
* **model loading**: each rank stages its weight shard in host RAM before copying it to the GPU
  (safetensors into pageable memory, then ``.to(device)``), in the *checkpoint's* dtype:
  bitsandbytes nf4/int8 quantise on load from a 16-bit checkpoint, so they stage 2 bytes per
  parameter. ZeRO-3 / FSDP full-shard jobs load the model once per node (rank 0 loads, the
  others receive shards: FSDP ``sync_module_states``, DeepSpeed ``zero.Init``);
* **CPU offload while running**: ``activation_offload`` keeps the saved activations in pinned
  host buffers (what the GPU memory model no longer counts), and ``paged_adamw_8bit`` keeps its
  states in CUDA unified memory that pages out to host RAM under pressure (all of them, worst
  case).

Loading ends before the first step, so the peak is the baseline plus the larger of loading and
running. ZeRO-Offload (optimizer states in CPU RAM) has no spec field yet, so it is not
estimated; a job that uses it sets ``host_memory_gib``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ._jobarrays import OPTIMIZERS, _arch_numbers, job_arrays
from ._memory import GIB, MemoryModel, _components
from .spec import DType, JobSpec, Optimizer

__all__ = ["HostMemoryModel", "host_memory_gib"]

_STAGED_BYTES: dict[DType, float] = {
    DType.FP32: 4.0,
    DType.BF16: 2.0,
    DType.FP16: 2.0,
    DType.FP8: 1.0,
    DType.INT8: 2.0,  # bitsandbytes LLM.int8 quantises a 16-bit checkpoint on load
    DType.NF4: 2.0,  # bitsandbytes nf4 likewise (QLoRA)
    DType.INT4: 0.5 + 2.5 / 128,  # GPTQ/AWQ checkpoints are stored quantised
    DType.FP4: 0.5 + 1.0 / 16,
}

_QUANTISED = frozenset({DType.FP8, DType.INT8, DType.INT4, DType.NF4, DType.FP4})


@dataclass(frozen=True, slots=True)
class HostMemoryModel:
    """Constants of the host-memory estimate."""

    # Host RSS of one rank before its model: 0.24 GiB for `import torch, transformers` (CPU
    # torch 2.13 on the dev machine: `python -c "import resource, torch, transformers;
    # print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"`), plus about 1.1 GiB that a
    # CUDA build's first kernel launch added to the host RSS (pytorch/pytorch#12873), plus
    # data-loader workers; rounded up to 2 GiB per rank.
    process_gib: float = 2.0


def _staged_bytes_per_rank(spec: JobSpec) -> float:
    """Bytes of weights one rank stages in host RAM while loading (its TP/PP shard)."""
    a = _arch_numbers(spec.arch)
    dtype = spec.weight_dtype or DType.BF16
    per_param = _STAGED_BYTES[dtype]
    tp, pp = spec.tensor_parallel, spec.pipeline_parallel
    body = a.total_params - a.embed_params
    # Quantised formats keep embeddings and the head in 16 bits, as the GPU memory model does.
    embed_bytes = a.embed_params * (2.0 if dtype in _QUANTISED else per_param)
    embed_share = 0.5 if pp > 1 else 1.0  # first stage holds the input table, last the head
    return body * per_param / (tp * pp) + embed_bytes * embed_share / tp


def _offload_bytes_per_rank(specs: Sequence[JobSpec], mm: MemoryModel) -> np.ndarray:
    """Per job, bytes one rank keeps in host RAM while running (activation and paged offload)."""
    out = np.zeros(len(specs))
    rows = [
        i
        for i, s in enumerate(specs)
        if s.activation_offload or s.optimizer is Optimizer.PAGED_ADAMW_8BIT
    ]
    if not rows:
        return out
    j = job_arrays([specs[i] for i in rows])
    on = _components(j, mm)
    off = _components(replace(j, act_offload=np.zeros_like(j.act_offload)), mm)
    # What activation offload takes off the GPU waits in pinned host buffers.
    acts = np.maximum(off["activations"] - on["activations"], 0.0)
    paged = j.optimizer == OPTIMIZERS.index(Optimizer.PAGED_ADAMW_8BIT)
    # The optimizer figure at the step peak holds every state (backward-peak jobs report them
    # under "optimizer" too), so it is the most paging can move to the host.
    states = np.where(paged, off["optimizer"], 0.0)
    out[rows] = acts + states
    return out


def host_memory_gib(
    specs: Sequence[JobSpec],
    model: HostMemoryModel | None = None,
    memory_model: MemoryModel | None = None,
) -> np.ndarray:
    """Per job, the host memory (GiB) all its ranks need on its node, as estimated above."""
    hm = model or HostMemoryModel()
    mm = memory_model or MemoryModel()
    n = len(specs)
    if not n:
        return np.zeros(0)
    ranks = np.fromiter((s.n_gpus for s in specs), np.float64, n)
    staged = np.fromiter((_staged_bytes_per_rank(s) for s in specs), np.float64, n)
    full_shard = np.fromiter(((s.zero_stage or 0) >= 3 for s in specs), bool, n)
    # ZeRO-3 jobs load the whole model once per node (staged here is one rank's TP/PP shard of
    # it; under ZeRO-3 TP/PP are usually 1, so that is the whole model).
    loading = np.where(full_shard, staged, staged * ranks)
    running = _offload_bytes_per_rank(specs, mm) * ranks
    return hm.process_gib * ranks + np.maximum(loading, running) / GIB
