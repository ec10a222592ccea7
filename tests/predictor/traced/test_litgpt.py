"""LitGPT's program (framework ``other``) against hand-computed sizes on tiny models."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.spec import parse_spec  # noqa: E402
from predictor.traced import _step  # noqa: E402
from predictor.traced._build import build_meta_model  # noqa: E402
from predictor.traced._litgpt import LM_HEAD_CHUNK, fuse_qkv_outputs, untie_head  # noqa: E402
from predictor.traced._patches import ATTN_IMPLEMENTATION, install  # noqa: E402
from tests.jobs import TINY_MHA  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore")]

L, H, NH, HD, FFN, V = 2, 64, 4, 16, 128, 1000
MHA: dict[str, Any] = TINY_MHA


def _model(arch: dict[str, Any]) -> Any:
    install()
    return build_meta_model(
        parse_spec({"model": arch, "task": "inference"}).arch, torch.bfloat16, ATTN_IMPLEMENTATION
    )


def test_mha_value_keeps_a_fused_qkv_sized_buffer_and_gqa_does_not() -> None:
    model = _model(MHA)
    assert fuse_qkv_outputs(model) == L
    v_proj = model.model.layers[0].self_attn.v_proj
    v = v_proj(torch.zeros(2, 8, H, dtype=torch.bfloat16, device="meta"))
    assert v.shape == (2, 8, NH * HD)
    # q + k + v of the fused projection: what the attention kernel's saved v keeps alive
    assert v.untyped_storage().nbytes() == 3 * 2 * 8 * NH * HD * 2
    assert fuse_qkv_outputs(_model({**MHA, "n_kv_heads": 2})) == 0


def test_tied_embeddings_become_two_tables() -> None:
    model = _model({**MHA, "tie_embeddings": True})
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is emb
    untie_head(model)
    head = model.get_output_embeddings().weight
    assert head is not emb and head.shape == emb.shape


def _carried(spec: dict[str, Any], monkeypatch: Any) -> tuple[int, Any]:
    """Bytes the step's training loop keeps of its last graph, and the timeline."""
    seen: dict[str, int] = {}
    orig = _step._timeline

    def spy(tr: Any, n: int, second_step: Any = None, carried: Any = (0, [])) -> Any:
        sizes = {h: nb for op, h, nb in tr.events if op}
        seen["bytes"] = sum(sizes.get(h, 0) for h in carried[1])
        return orig(tr, n, second_step, carried)

    monkeypatch.setattr(_step, "_timeline", spy)
    tl = _step.run_trace(parse_spec(spec))
    return seen["bytes"], tl


def test_litgpt_qlora_loop_keeps_the_4bit_inputs_and_logits_chunks(monkeypatch: Any) -> None:
    """bitsandbytes <= 0.43 keeps each 4-bit matmul's input in ``ctx.tensors`` and LitGPT's
    loop keeps the last graph (and ``logits``) until the next micro-batch's loss: per layer
    the q/k/v input, o_proj's, gate/up's and down_proj's, then the head's input and the logits
    chunks, in fp32 as Fabric returned them (the head is quantised too)."""
    b, t = 1, 2 * LM_HEAD_CHUNK
    spec = {
        "model": MHA,
        "task": "qlora",
        "framework": "other",
        "batch_size": b,
        "seq_len": t,
        "lora_rank": 4,
        "lora_target": "qv",
        "gradient_checkpointing": False,  # as the LitGPT rows run (QLoRA defaults it on)
    }
    held, _tl = _carried(spec, monkeypatch)
    per_layer = b * t * (H + NH * HD + H + FFN) * 2
    first_qkv_input = b * t * H * 2  # the frozen embedding's normed output needs no grad
    head_input = b * t * H * 2
    logits = b * t * V * 4  # the fp32 chunks Fabric's wrapper returned
    loss = 4  # fp32: the fp32 adapters put the step under (emulated) autocast
    expected = L * per_layer - first_qkv_input + head_input + logits + loss
    assert held == expected
    # HF's Trainer drops its loss after backward: nothing carried
    hf, _ = _carried({**spec, "framework": "hf"}, monkeypatch)
    assert hf < 1024


def test_litgpt_loss_runs_the_head_on_chunks_returned_in_fp32() -> None:
    """bf16-true (bf16 adapters, no autocast), as the LitGPT rows run: the head runs on
    128-token chunks, and Fabric's wrapper hands each chunk back as an fp32 copy (the precision
    plugin's ``convert_output``), on which the chunk's cross-entropy runs."""
    b, t = 2, 3 * LM_HEAD_CHUNK
    base = {
        "model": MHA,
        "task": "lora",
        "adapter_dtype": "bf16",
        "batch_size": b,
        "seq_len": t,
        "lora_rank": 4,
        "lora_target": "qv",
    }
    biggest = {}
    chunk_sizes: dict[int, int] = {}
    for fw in ("other", "hf"):
        tl = _step.run_trace(parse_spec({**base, "framework": fw}))
        logits = [n for op, h, n in tl.events if op and tl.category[h] == "logits"]
        biggest[fw] = max(logits)
        if fw == "other":
            for n in logits:
                chunk_sizes[n] = chunk_sizes.get(n, 0) + 1
    assert biggest["other"] == b * LM_HEAD_CHUNK * V * 4  # one fp32 chunk at a time
    # per chunk and step: the bf16 head output and its fp32 copy
    assert chunk_sizes[b * LM_HEAD_CHUNK * V * 2] >= t // LM_HEAD_CHUNK
    assert biggest["hf"] >= b * t * V * 4  # HF upcasts the whole sequence's logits to fp32


def _peak_live(events: list[tuple[int, int, int]]) -> int:
    live: dict[int, int] = {}
    peak = 0
    for op, h, n in events:
        if op:
            live[h] = n
        else:
            live.pop(h, None)
        peak = max(peak, sum(live.values()))
    return peak


def test_lightning_bnb_4bit_layer_dequantises_to_fp16_then_casts() -> None:
    """Lightning's bitsandbytes plugin quantises from fp16, so ``dequantize_4bit`` returns
    fp16 and ``.to(A.dtype)`` makes the bf16 copy beside it (bitsandbytes 0.41
    ``MatMul4Bit.forward``); quantised from bf16 (HF) the cast is a no-op."""
    from predictor.traced._dispatch import StorageTracker
    from predictor.traced._patches import QuantLinearStub

    x = torch.zeros(2, 8, H, dtype=torch.bfloat16, device="meta")
    weight = H * FFN * 2
    peaks = {}
    for state in (torch.float16, torch.bfloat16):
        stub = QuantLinearStub(H, FFN, 0.5, torch.bfloat16, None)
        stub.state_dtype = state
        with StorageTracker() as tr:
            y = stub(x)
        del y
        peaks[state] = _peak_live(tr.events)
    assert peaks[torch.float16] >= 2 * weight > peaks[torch.bfloat16] >= weight
    litgpt = {"model": MHA, "task": "qlora", "framework": "other", "seq_len": 8, "lora_rank": 2}
    model = _step._train_model(parse_spec({**litgpt, "lora_target": "qv"}))
    stubs = [m for m in model.modules() if isinstance(m, QuantLinearStub)]
    assert stubs and all(s.state_dtype is torch.float16 for s in stubs)


def test_litgpt_tensor_parallel_keeps_both_vocabulary_tables_whole() -> None:
    """generate/tp.py shards only the blocks' linears: wte and the untied head stay whole on
    every rank, 1 - 1/TP of them beyond the sharded trace's share."""
    from predictor.traced._run import _tp_replicated_bytes

    inf = {"model": MHA, "task": "inference", "input_len": 8, "output_len": 8}
    tp4 = {**inf, "framework": "other", "n_gpus": 4, "tensor_parallel": 4}
    assert _tp_replicated_bytes(parse_spec(tp4)) == int(2 * V * H * 2 * 0.75)
    assert _tp_replicated_bytes(parse_spec({**tp4, "framework": "hf"})) == 0
    assert _tp_replicated_bytes(parse_spec({**inf, "framework": "other"})) == 0
