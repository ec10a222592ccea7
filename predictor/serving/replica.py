"""Throughput of one fixed deployment shape, for comparing with published benchmarks.

Benchmarks report either a closed loop of N concurrent clients ("users", ``concurrency``) or
"max load" (every request submitted at once, the engine's batch limited by its KV cache).
"""

from __future__ import annotations

from ..gpus import get_gpu
from ..models import resolve_model
from ..spec import DType, Framework
from ._engines import ENGINE_BATCH_CAP, kv_budget, tokens_per_sequence
from ._perf import PERF, PerfConstants, Slot, replica_perf
from ._queueing import throughput_at_concurrency

__all__ = ["replica_throughput"]


def replica_throughput(
    model: str,
    gpu: str,
    tp: int,
    weight: str,
    kv: str,
    framework: str,
    input_len: int,
    output_len: int,
    concurrency: int | None = None,
    constants: PerfConstants = PERF,
) -> dict[str, float]:
    """Output tokens/s of one replica (its whole TP group), the batch it runs, its step time
    (≈ TPOT), one prompt's prefill alone (the zero-load TTFT) and its KV-cache tokens.

    ``concurrency`` None means max load: the batch is the KV-cache limit (capped by the
    engine's batch limit).
    """
    arch = resolve_model(model)
    fw = Framework(framework)
    w, k = DType(weight), DType(kv)
    slot = Slot(get_gpu(gpu))
    perf = replica_perf(arch, slot, tp, w, k, fw, constants)
    cap = ENGINE_BATCH_CAP[fw]
    mem = kv_budget(arch, slot, tp, fw, perf.weight_bytes, perf.kv_bytes_token, cap)
    max_batch = max(1, min(cap, mem.kv_tokens // tokens_per_sequence(input_len, output_len)))
    users = max_batch if concurrency is None else concurrency
    tok_s = throughput_at_concurrency(perf.iteration_s, users, max_batch, input_len, output_len)
    batch = float(min(users, max_batch))
    return {
        "output_tok_s": tok_s,
        "batch": batch,
        "step_s": batch / tok_s,
        "ttft_alone_s": perf.prefill_s(input_len),
        "kv_tokens": float(mem.kv_tokens),
    }
