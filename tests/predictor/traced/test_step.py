"""The tracer against hand-computed tensor sizes on tiny models (torch needed)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.spec import parse_spec  # noqa: E402
from predictor.traced._step import run_trace  # noqa: E402
from predictor.traced._summary import summarise  # noqa: E402
from tests.jobs import TINY_LLAMA  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore")]

L, H, NH, KVH, HD, FFN, V = 2, 64, 4, 2, 16, 128, 1000
TINY: dict[str, Any] = TINY_LLAMA
# q, k, v, o + gate, up, down per layer; 2 RMSNorms per layer, final norm; untied embed + head
N_PARAMS = L * (H * NH * HD + 2 * H * KVH * HD + NH * HD * H + 3 * H * FFN + 2 * H) + H + 2 * V * H


def _live_by_category(spec: Any) -> tuple[dict[str, int], Any]:
    tl = run_trace(parse_spec(spec))
    alive: dict[int, int] = {}
    first_alloc: dict[str, int] = {}
    for op, h, n in tl.events:
        if op:
            alive[h] = n
            cat = tl.category[h]
            first_alloc[cat] = first_alloc.get(cat, 0) + n
        else:
            alive.pop(h, None)
    return first_alloc, tl


def _peak_live(tl: Any, category: str) -> int:
    """The most bytes of ``category`` alive at once over the timeline."""
    live: dict[int, int] = {}
    most = 0
    for op, h, n in tl.events:
        if op:
            live[h] = n
        else:
            live.pop(h, None)
        most = max(most, sum(v for k, v in live.items() if tl.category[k] == category))
    return most


def test_full_finetune_weights_grads_and_adamw_states() -> None:
    spec = {"model": TINY, "task": "full_finetune", "batch_size": 2, "seq_len": 32}
    _totals, tl = _live_by_category(spec)
    assert tl.n_params == N_PARAMS
    weights = [n for op, h, n in tl.events if op and tl.category[h] == "weights"]
    # bf16 parameters, plus small buffers (rotary inv_freq and its original copy, fp32)
    assert N_PARAMS * 2 <= sum(weights) <= N_PARAMS * 2 + 1024
    grads = sum(n for op, h, n in tl.events if op and tl.category[h] == "gradients")
    # every gradient once per step: the traced first step and the steady-state second one
    assert grads == 2 * N_PARAMS * 2
    states = sum(
        n
        for op, h, n in tl.events
        if op and tl.category[h] == "optimizer" and tl.phase[h] == "optimizer_state"
    )
    # exp_avg and exp_avg_sq in the parameter dtype, made once, at the first optimizer step
    assert states == 2 * N_PARAMS * 2
    first_state = next(
        i for i, (op, h, _) in enumerate(tl.events) if op and tl.phase[h] == "optimizer_state"
    )
    first_grad = next(
        i for i, (op, h, _) in enumerate(tl.events) if op and tl.category[h] == "gradients"
    )
    assert first_grad < first_state  # lazily, after the first backward, as torch does


def test_allocated_peak_is_the_steady_state_step() -> None:
    """The first step has no states during its forward; the peak is the second step's, with
    every AdamW state live beside the saved activations."""
    spec = {"model": TINY, "task": "full_finetune", "batch_size": 8, "seq_len": 256}
    tl = run_trace(parse_spec(spec))
    s = summarise(tl.events, tl.category, parse_spec(spec))
    assert s.breakdown_gib["optimizer"] * (1 << 30) >= 2 * N_PARAMS * 2
    assert s.breakdown_gib["activations"] > 0


def test_lora_trains_only_adapters_in_their_dtype() -> None:
    spec = {"model": TINY, "task": "lora", "batch_size": 1, "seq_len": 16, "lora_rank": 4}
    _, tl = _live_by_category(spec)
    grads = sum(n for op, h, n in tl.events if op and tl.category[h] == "gradients")
    lora = 4 * L * ((H + NH * HD) * 2 + (H + KVH * HD) * 2 + (H + FFN) * 2 + (FFN + H))
    assert grads == 2 * lora * 4  # fp32 adapters (PEFT's default), once per traced step


def test_inference_kv_cache_at_final_length() -> None:
    b, inp, out = 3, 20, 5
    spec = {
        "model": TINY,
        "task": "inference",
        "batch_size": b,
        "input_len": inp,
        "output_len": out,
    }
    peak_kv = _peak_live(run_trace(parse_spec(spec)), "kv_cache")
    final = 2 * L * KVH * HD * 2 * b * (inp + out)
    # Concatenation briefly holds one layer's old and new K or V.
    assert final <= peak_kv <= final + 2 * KVH * HD * 2 * b * (inp + out)


def _peak_kv(spec: dict[str, Any]) -> tuple[int, int, Any]:
    """(peak live kv_cache bytes, kv_cache bytes live before the first forward allocation,
    the timeline)."""
    tl = run_trace(parse_spec(spec))
    live: dict[int, int] = {}
    peak_kv, before_forward, seen_forward = 0, 0, False
    for op, h, n in tl.events:
        if op:
            live[h] = n
            if tl.category[h] not in ("weights", "kv_cache"):
                seen_forward = True
        else:
            live.pop(h, None)
        kv = sum(v for k, v in live.items() if tl.category[k] == "kv_cache")
        peak_kv = max(peak_kv, kv)
        if not seen_forward:
            before_forward = kv
    return peak_kv, before_forward, tl


def test_preallocated_kv_cache_holds_its_full_length_from_the_start() -> None:
    """``kv_cache_max_len``: K and V of every layer at the preallocated length, allocated before
    the prefill, whatever the prompt and output lengths (torchtune's setup_caches)."""
    b, inp, out, n = 2, 6, 10, 64
    spec = {"model": TINY, "task": "inference", "batch_size": b, "input_len": inp}
    spec |= {"output_len": out, "kv_cache_max_len": n}
    full = 2 * L * b * KVH * n * HD * 2  # K and V, bf16
    pos = 8 * L  # StaticCache's int64 length counter per layer
    peak, before, _ = _peak_kv(spec)
    assert peak == before == full + pos
    assert _peak_kv({**spec, "output_len": 40})[0] == full + pos
    # expanded to the query heads: NH heads wide instead of KVH
    wide, before_wide, _ = _peak_kv({**spec, "kv_cache_query_heads": True})
    assert wide == before_wide == full * NH // KVH + pos
    # a growing cache expanded too: the final length at NH heads (plus one layer's concat)
    grown, _, _ = _peak_kv({**spec, "kv_cache_max_len": None, "kv_cache_query_heads": True})
    final = 2 * L * b * NH * (inp + out) * HD * 2
    assert final <= grown <= final + 2 * KVH * HD * 2 * b * (inp + out)


def test_summary_breakdown_sums_to_allocated_and_shards() -> None:
    spec = parse_spec({"model": TINY, "task": "full_finetune", "batch_size": 2, "seq_len": 32})
    tl = run_trace(spec)
    s = summarise(tl.events, tl.category, spec)
    assert sum(s.breakdown_gib.values()) == pytest.approx(s.allocated_gib)
    assert s.reserved_gib >= s.allocated_gib
    z3 = parse_spec(
        {
            "model": TINY,
            "task": "full_finetune",
            "batch_size": 2,
            "seq_len": 32,
            "n_gpus": 4,
            "zero_stage": 3,
        }
    )
    s3 = summarise(tl.events, tl.category, z3)
    assert s3.allocated_gib < s.allocated_gib


def test_moe_routes_tokens_evenly_to_top_k_experts() -> None:
    def gemm_flops(top_k: int) -> float:
        moe = {**TINY, "n_experts": 4, "n_active_experts": top_k, "family": "mixtral"}
        spec = {
            "model": moe,
            "task": "inference",
            "batch_size": 2,
            "input_len": 16,
            "output_len": 2,
        }
        return run_trace(parse_spec(spec)).costs["gemm"].flops

    one, two = gemm_flops(1), gemm_flops(2)
    # Expert MLP FLOPs double with top-2 routing (attention and the LM head do not change).
    per_token_expert = 2 * 3 * H * FFN * L
    tokens = 2 * 16 + 2 * 1
    assert two - one == pytest.approx(per_token_expert * tokens, rel=0.02)


def test_8bit_adamw_states_are_two_bytes_per_parameter() -> None:
    spec = {
        "model": TINY,
        "task": "full_finetune",
        "batch_size": 1,
        "seq_len": 8,
        "optimizer": "adamw_8bit",
    }
    tl = run_trace(parse_spec(spec))
    states = sum(
        n
        for op, h, n in tl.events
        if op and tl.category[h] == "optimizer" and tl.phase[h] == "optimizer_state"
    )
    assert 2 * N_PARAMS <= states <= 2 * N_PARAMS * 1.02


def test_memoised_meta_ops_record_the_same_trace() -> None:
    """Memoising pure ops on their arguments' metadata changes no event, size or FLOP."""
    from predictor.traced._dispatch import StorageTracker
    from predictor.traced._patches import install
    from predictor.traced._step import _train, _train_model

    install()
    spec = parse_spec(
        {"model": TINY, "task": "lora", "batch_size": 2, "seq_len": 16, "lora_rank": 4}
    )
    traces = []
    for memoise in (False, True):
        tr = StorageTracker(memoise=memoise)
        model = _train_model(spec)
        with tr:
            tl = _train(spec, model, tr)
        traces.append((tl.events, tl.category, {k: v.flops for k, v in tl.costs.items()}))
    assert traces[0] == traces[1]
    assert len(traces[0][0]) > 100


def test_hf_trainer_adamw_makes_no_foreach_temporaries() -> None:
    """HF Trainer steps AdamW per parameter (or fused): no full-size temporary set at the
    optimizer step, which torch's foreach default (plain training loops) does make."""
    arch = {**TINY, "n_layers": 4, "vocab_size": 64}  # no parameter dominates the total
    n = 4 * (H * NH * HD + 2 * H * KVH * HD + NH * HD * H + 3 * H * FFN + 2 * H) + H + 2 * 64 * H
    base = {"model": arch, "task": "full_finetune", "batch_size": 1, "seq_len": 8}
    peaks = {}
    for fw in ("hf", "other"):
        spec = parse_spec({**base, "framework": fw})
        tl = run_trace(spec)
        peaks[fw] = summarise(tl.events, tl.category, spec).allocated_gib * (1 << 30)
    # foreach holds one bf16 temporary per parameter at once; HF at most a few of the largest
    assert peaks["other"] - peaks["hf"] >= n * 2 - 4 * H * FFN * 2


def _tiny_lora(**kw: Any) -> Any:
    """The tiny model's bf16-adapter LoRA step, batch 2 × 64 tokens, with ``kw`` on top."""
    return parse_spec(
        {
            "model": TINY,
            "task": "lora",
            "batch_size": 2,
            "seq_len": 64,
            "lora_rank": 4,
            "lora_target": "qv",
            "adapter_dtype": "bf16",
            **kw,
        }
    )


def test_qv_lora_on_a_fused_qkv_model_adapts_the_fused_projection() -> None:
    """GPT-NeoX has one query_key_value linear: q/v LoRA adapts it, as LitGPT's fused
    LoRAQKVLinear does, so only adapter weights get gradients."""
    arch = {
        "name": "neox-tiny",
        "n_layers": 2,
        "hidden_size": H,
        "n_heads": NH,
        "n_kv_heads": NH,
        "head_dim": HD,
        "intermediate_size": FFN,
        "vocab_size": V,
        "gated_mlp": False,
        "norm": "layernorm",
        "position": "rope",
    }
    spec = {
        "model": arch,
        "task": "lora",
        "batch_size": 1,
        "seq_len": 16,
        "lora_rank": 4,
        "lora_target": "qv",
    }
    tl = run_trace(parse_spec(spec))
    grads = sum(n for op, h, n in tl.events if op and tl.category[h] == "gradients")
    # A: r x hidden, B: 3·hidden x r per layer, fp32, once per traced step
    assert grads == 2 * 2 * 4 * (H + 3 * NH * HD) * 4


def _lora_peak(**kw: Any) -> float:
    spec = _tiny_lora(**kw)
    tl = run_trace(spec)
    return summarise(tl.events, tl.category, spec).allocated_gib * (1 << 30)


def _saved_at_backward(**kw: Any) -> int:
    """Activation bytes alive when backward reaches the last decoder layer (everything the
    layers saved for it), in the first traced step."""
    spec = _tiny_lora(**kw)
    tl = run_trace(spec)
    live: dict[int, int] = {}
    for op, h, n in tl.events:
        if op and tl.phase.get(h) == "backward":
            break
        if op:
            live[h] = n
        else:
            live.pop(h, None)
    return sum(n for h, n in live.items() if tl.category[h] == "activations")


def test_lora_dropout_keeps_a_mask_and_a_dropped_copy_per_adapter() -> None:
    """Adapters in the compute dtype save the layer input itself; with dropout each adapter
    saves its dropped copy (2 bytes) and a 1-byte mask (CUDA's fused ``native_dropout``)
    instead. q and v share the input, so per layer two copies and two masks replace it; the
    first layer's input (the frozen embedding's normed output) needs no grad, so no autograd
    node keeps its masks."""
    elems = 2 * 64 * H  # one layer's adapted input
    base = _saved_at_backward(framework="torchtune")
    dropped = _saved_at_backward(framework="torchtune", lora_dropout=0.1)
    assert dropped - base == elems * (2 * 2 - 2) + (L - 1) * elems * (2 * 2 + 2 * 1 - 2)


def test_litgpt_lora_dropout_drops_the_shared_qkv_input_once() -> None:
    """LitGPT's fused LoRAQKVLinear applies one dropout for q, k and v: its copy replaces the
    input, so only the 1-byte mask is new (none in the first layer, whose input needs no
    grad)."""
    elems = 2 * 64 * H
    base = _saved_at_backward(framework="other")
    dropped = _saved_at_backward(framework="other", lora_dropout=0.1)
    assert dropped - base == (L - 1) * elems * 1


def test_traced_dropout_keeps_a_one_byte_mask_as_on_cuda() -> None:
    from predictor.traced._dispatch import StorageTracker
    from predictor.traced._patches import install

    install()
    x = torch.zeros(64, 64, dtype=torch.float32, device="meta", requires_grad=True)
    with StorageTracker() as tr:
        y = torch.nn.functional.dropout(x, p=0.1, training=True)
    assert sorted(n for op, _, n in tr.events if op) == [64 * 64, 64 * 64 * 4]  # mask, output
    assert type(y.grad_fn).__name__ == "NativeDropoutBackward0"


def test_eager_attention_stores_the_scores() -> None:
    """attn_implementation eager keeps the softmax (fp32, as HF upcasts it) and its 16-bit
    cast for backward: at least 6 bytes per score of every layer."""
    scores = 2 * NH * 64 * 64
    assert _lora_peak(attn_implementation="eager") - _lora_peak() >= (L - 1) * scores * 6


def test_nf4_weights_take_their_double_quant_size() -> None:
    """bitsandbytes nf4 stores one fp32 absmax per 64 weights; double quantisation stores an
    8-bit one plus an fp32 scale per 256 blocks."""
    spec = {"model": TINY, "task": "qlora", "batch_size": 1, "seq_len": 8, "lora_rank": 4}
    sizes = {}
    for dq in (False, True):
        tl = run_trace(parse_spec({**spec, "double_quant": dq}))
        sizes[dq] = sum(n for op, h, n in tl.events if op and tl.category[h] == "weights")
    block_linears = L * (H * NH * HD + 2 * H * KVH * HD + NH * HD * H + 3 * H * FFN)
    per_weight = (4 / 64) - (1 / 64 + 4 / (64 * 256))
    assert sizes[False] - sizes[True] == pytest.approx(block_linears * per_weight, rel=0.02)


def test_pipeline_stage_holds_a_whole_embedding_table() -> None:
    """Under PP the first stage keeps the input table and the last the head: the heaviest
    stage holds body / PP plus one full table (untied: the same as an even split only at
    PP 2, so a 4-layer model at PP 4 shows it)."""
    from predictor.traced._run import trace_summary

    arch = {**TINY, "n_layers": 4}
    job = {"model": arch, "task": "inference", "batch_size": 1, "input_len": 8, "output_len": 2}
    one = trace_summary(job)["breakdown_gib"]["weights"] * (1 << 30)
    four = trace_summary({**job, "n_gpus": 4, "pipeline_parallel": 4})["breakdown_gib"]["weights"]
    table = V * H * 2
    body = one - 2 * table
    # (an even split would give body / 4 + table / 2, 30% less here; rounding and buffers)
    assert four * (1 << 30) == pytest.approx(body / 4 + table, rel=0.05)


def test_inference_stage_keeps_one_layers_working_set() -> None:
    """Inference saves nothing across layers, so a pipeline stage's activations (here the
    dequantised weight of an nf4 layer, the largest transient) are those of one layer,
    whatever its share of the layers; training divides by PP (1F1B in-flight micro-batches)."""
    from predictor.traced._summary import shard_factors

    arch = {**TINY, "n_layers": 4}
    job = {"model": arch, "task": "inference", "batch_size": 1, "input_len": 8, "output_len": 2}
    nf4 = {**job, "weight_dtype": "nf4"}
    pp4 = {**nf4, "n_gpus": 4, "pipeline_parallel": 4}
    assert shard_factors(parse_spec(pp4))["activations"] == 1.0
    train = {"model": arch, "task": "full_finetune", "batch_size": 1, "seq_len": 8}
    assert shard_factors(parse_spec({**train, "n_gpus": 4, "pipeline_parallel": 4}))[
        "activations"
    ] == pytest.approx(1 / 4)
    tl = run_trace(parse_spec(nf4))
    one = summarise(tl.events, tl.category, parse_spec(nf4)).breakdown_gib["activations"]
    four = summarise(tl.events, tl.category, parse_spec(pp4)).breakdown_gib["activations"]
    # the down projection's dequantised bf16 weight is live at the peak on every stage
    assert four * (1 << 30) >= H * FFN * 2
    assert four == pytest.approx(one, rel=0.25)


def test_litgpt_sequential_root_holds_both_tables() -> None:
    """LitGPT's sequential generation puts every block on its device and wte, ln_f and the
    (untied) head on the root, whose peak it prints: the root holds both tables."""
    from predictor.traced._run import trace_summary

    arch = {**TINY, "n_layers": 4}
    job = {"model": arch, "task": "inference", "batch_size": 1, "input_len": 8, "output_len": 2}
    pp4 = {**job, "n_gpus": 4, "pipeline_parallel": 4}
    hf = trace_summary(pp4)["breakdown_gib"]["weights"] * (1 << 30)
    lit = trace_summary({**pp4, "framework": "other"})["breakdown_gib"]["weights"] * (1 << 30)
    table = V * H * 2
    # HF's heaviest stage: one full table; LitGPT's root: both
    assert lit - hf == pytest.approx(table, rel=0.05)


def test_zero_grad_without_set_to_none_keeps_the_gradients_through_the_next_step() -> None:
    """torch < 2.0's ``zero_grad()`` zeroed the gradients in place: they are made once, in the
    first backward, and the steady-state step accumulates into them (none made again); its
    forward runs with all of them alive, so the allocated peak grows by at most their size
    (each rounded up to the allocator's 512 bytes)."""
    spec = {"model": TINY, "task": "full_finetune", "batch_size": 4, "seq_len": 64}
    kept = {**spec, "zero_grad_set_to_none": False}
    _, tl = _live_by_category(kept)
    grads = [n for op, h, n in tl.events if op and tl.category[h] == "gradients"]
    assert sum(grads) == N_PARAMS * 2
    freed = summarise(*_events(spec), parse_spec(spec)).allocated_gib
    held = summarise(tl.events, tl.category, parse_spec(kept)).allocated_gib
    assert 0 < (held - freed) * (1 << 30) <= sum(-(-n // 512) * 512 for n in grads)


def _events(spec: dict[str, Any]) -> tuple[Any, Any]:
    tl = run_trace(parse_spec(spec))
    return tl.events, tl.category


def _peak(spec: dict[str, Any]) -> tuple[float, float]:
    s = parse_spec(spec)
    tl = run_trace(s)
    out = summarise(tl.events, tl.category, s)
    return out.allocated_gib * (1 << 30), out.breakdown_gib["logits"] * (1 << 30)


def test_classification_head_has_no_vocabulary_logits() -> None:
    spec = {"model": TINY, "task": "full_finetune", "batch_size": 2, "seq_len": 64}
    _, lm_logits = _peak(spec)
    _, cls_logits = _peak({**spec, "head": "classification"})
    # the bf16 vocabulary logits at least (the rest of the category is backward's working set)
    assert lm_logits - cls_logits >= 2 * 64 * V * 2


def test_torch_before_1_11_keeps_each_softmax_input() -> None:
    """Eager Llama attention softmaxes bf16 scores with dtype=fp32, so torch < 1.11 saved the
    fp32 copy it made: 4 bytes per score of every layer at the start of backward. Under
    checkpointing the recompute keeps them too (one layer at a time), and traces."""
    b, s = 2, 64
    spec = {"model": TINY, "task": "full_finetune", "batch_size": b, "seq_len": s}
    spec |= {"attn_implementation": "eager"}
    base, _ = _peak(spec)
    old, _ = _peak({**spec, "torch_version": "1.10"})
    assert old - base == L * b * NH * s * s * 4
    assert _peak({**spec, "torch_version": "1.11"})[0] == base
    ckpt = {**spec, "gradient_checkpointing": True}
    assert _peak({**ckpt, "torch_version": "1.10.2"})[0] >= _peak(ckpt)[0]


def test_transformers_before_4_50_shifts_a_fp32_copy_of_the_logits() -> None:
    """transformers v4.31.0 modeling_llama.py (lines 825-838): ``logits.float()``, then
    ``logits[..., :-1, :].contiguous()``, a second fp32 copy of b x (s-1) x V, whose backward
    scatters into a zero-filled b x s x V fp32 tensor. Current transformers shifts the labels."""
    b, s = 2, 32
    spec = {"model": TINY, "task": "full_finetune", "batch_size": b, "seq_len": s}
    shifted, full = b * (s - 1) * V * 4, b * s * V * 4

    def sizes(**kw: object) -> list[int]:
        tl = run_trace(parse_spec({**spec, **kw}))
        return [n for op, h, n in tl.events if op and tl.category[h] == "logits"]

    old, new = sizes(transformers_version="4.31"), sizes()
    assert shifted in old and shifted not in new
    # the fp32 logits themselves, and the zero-filled gradient of the slice in backward
    assert old.count(full) >= 2
    assert sizes(transformers_version="4.50.0") == new

    # at the loss: the fp32 logits, their shifted copy and log-softmax's fp32 output
    old_tl = run_trace(parse_spec({**spec, "transformers_version": "4.31.0"}))
    assert _peak_live(old_tl, "logits") >= full + 2 * shifted


def test_use_cache_keeps_every_layers_k_and_v_until_the_loss() -> None:
    """``use_cache`` in training (transformers v4.31.0 modeling_llama.py lines 324, 615, 704-716):
    K and V of every layer, b x kv_heads x s x head_dim in bf16, live at the loss, none after."""
    b, s = 2, 32
    spec = {"model": TINY, "task": "full_finetune", "batch_size": b, "seq_len": s}
    peak_kv, _, _ = _peak_kv({**spec, "use_cache": True})
    assert peak_kv == 2 * L * b * KVH * s * HD * 2
    assert _peak_kv(spec)[0] == 0
