"""One trace, end to end, inside a worker process: spec dict in, JSON-ready summary out."""

from __future__ import annotations

import time
from typing import Any

from .._jobarrays import weight_qbytes
from ..spec import Framework, parse_spec

__all__ = ["trace_summary"]

#: Weight dtypes the tracer stores quantised (``_step._QUANT_BYTES``).
_QUANTISED = ("nf4", "int4", "fp4", "int8", "fp8")


def trace_summary(spec_dict: dict[str, Any]) -> dict[str, Any]:
    from ._step import run_trace
    from ._summary import summarise

    spec = parse_spec(spec_dict)
    t0 = time.perf_counter()
    tl = run_trace(spec)
    trace_s = time.perf_counter() - t0
    arch = spec.arch
    extra = 0
    if spec.task.is_training and (spec.zero_stage or 0) >= 3 and spec.data_parallel > 1:
        # FSDP/ZeRO-3 all-gathers a layer ahead: two layers' full weights in the compute dtype.
        per_layer = (arch.total_params() - arch.embedding_params()) / arch.n_layers
        extra = int(2 * per_layer * 2 / spec.tensor_parallel)
    extra += _stage_embedding_bytes(spec) + _tp_replicated_bytes(spec)
    costs = {k: (v.flops, v.bytes) for k, v in tl.costs.items()}
    s = summarise(tl.events, tl.category, spec, costs, extra_weight_bytes=extra)
    out = s.to_dict()
    out["trace_s"] = trace_s
    out["n_params"] = tl.n_params
    return out


def _litgpt_tables(spec: Any) -> int:
    """Bytes of LitGPT's two vocabulary tables: ``wte`` in 16 (or 32) bits and the untied
    ``lm_head``, quantised with the blocks under bitsandbytes (the Fabric plugin replaces every
    ``nn.Linear``)."""
    arch = spec.arch
    table = arch.vocab_size * arch.hidden_size
    # The tracer keeps embeddings and the head in 16 bits for quantised weights.
    width = 4 if spec.weight_dtype is not None and spec.weight_dtype.value == "fp32" else 2
    quantised = spec.weight_dtype is not None and spec.weight_dtype.value in _QUANTISED
    return int(table * width + table * (weight_qbytes(spec) if quantised else width))


def _tp_replicated_bytes(spec: Any) -> int:
    """LitGPT's tensor parallelism shards only its blocks' linears: ``generate/tp.py``
    (@51d53287) ``tensor_parallel`` splits each block's ``attn``/``proj`` and MLP linears and
    leaves ``wte``, ``ln_f`` and ``lm_head`` whole on every rank; the sharded trace counts 1/TP
    of them, so the rest is added here."""
    tp = spec.tensor_parallel
    if tp <= 1 or spec.pipeline_parallel > 1 or spec.framework is not Framework.OTHER:
        return 0  # (LitGPT runs tensor or pipeline parallelism, not both)
    return max(0, int(_litgpt_tables(spec) * (1.0 - 1.0 / tp)))


def _stage_embedding_bytes(spec: Any) -> int:
    """What the heaviest pipeline stage holds beyond an even 1/PP share of the embeddings:
    the first stage keeps the whole input table and the last the whole head (as the
    analytical tier has it), so that stage holds one full table, not embeddings / PP.

    LitGPT (framework ``other``) splits only its blocks: ``generate/sequentially.py``
    (@51d53287) moves each block to its device and then "everything that is not a block in
    the root" (``wte``, ``ln_f``, ``lm_head``), the device whose peak the script prints. Its
    root holds both tables (untied, the head quantised with the blocks), less the 1/PP share
    of them the sharded trace already counts."""
    pp = spec.pipeline_parallel
    if pp <= 1:
        return 0
    arch = spec.arch
    table = arch.vocab_size * arch.hidden_size
    # The tracer keeps embeddings and the head in 16 bits for quantised weights.
    width = 4 if spec.weight_dtype is not None and spec.weight_dtype.value == "fp32" else 2
    if spec.framework is Framework.OTHER:  # LitGPT (see _litgpt.py)
        return max(0, int(_litgpt_tables(spec) * (1.0 - 1.0 / pp) / spec.tensor_parallel))
    per_stage_share = arch.embedding_params() / pp
    return max(0, int((table - per_stage_share) * width / spec.tensor_parallel))
