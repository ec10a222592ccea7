"""FSDP1's flat parameters under ``no_sync`` accumulation (LitGPT's loop), on a tiny model."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.spec import parse_spec  # noqa: E402
from predictor.traced._fsdp import ROOT, UNSHARDED, uses_no_sync_accumulation  # noqa: E402
from predictor.traced._step import run_trace  # noqa: E402
from predictor.traced._summary import shard_factors, summarise  # noqa: E402
from tests.jobs import TINY_MHA  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore")]

L, H, NH, HD, FFN, V, R = 2, 64, 4, 16, 128, 1000, 4
MHA: dict[str, Any] = TINY_MHA
# q, k, v, o; gate, up, down; two RMSNorms; LoRA A and B on q and v
LAYER = 4 * H * NH * HD + 3 * H * FFN + 2 * H + 2 * (R * H + NH * HD * R)
SPEC: dict[str, Any] = {
    "model": MHA,
    "task": "lora",
    "framework": "other",
    "adapter_dtype": "bf16",
    "weight_dtype": "bf16",
    "compute_dtype": "bf16",
    "batch_size": 2,
    "seq_len": 256,
    "lora_rank": R,
    "lora_target": "qv",
    "n_gpus": 2,
    "zero_stage": 3,
    "gradient_checkpointing": True,
    "optimizer": "adamw",
}


def _peak_gradients(spec: dict[str, Any]) -> float:
    s = parse_spec(spec)
    tl = run_trace(s)
    return summarise(tl.events, tl.category, s).breakdown_gib["gradients"] * (1 << 30)


def test_accumulating_litgpt_fsdp_keeps_every_blocks_unsharded_gradient() -> None:
    """Every block's flat parameter requires grad (its LoRA params do), so from the second
    micro-batch each rank holds the whole blocks' gradients, bf16, not divided by the GPUs."""
    spec = {**SPEC, "gradient_accumulation": 4}
    assert uses_no_sync_accumulation(parse_spec(spec))
    got = _peak_gradients(spec)
    assert L * LAYER * 2 <= got <= L * LAYER * 2 + L * 512  # one 512-byte rounding per block
    tl = run_trace(parse_spec(spec))
    unsharded = [n for op, h, n in tl.events if op and tl.category[h] == UNSHARDED]
    assert unsharded and max(unsharded) == LAYER * 2  # one flat gradient per block


def test_without_accumulation_or_outside_litgpt_only_lora_gradients_count() -> None:
    """One micro-batch syncs at once (sharded gradients); other stacks are not traced so."""
    lora_grads = L * 2 * (R * H + NH * HD * R) * 2
    fsdp = {**SPEC, "framework": "fsdp", "gradient_accumulation": 4}
    assert not uses_no_sync_accumulation(parse_spec(fsdp))
    for spec in ({**SPEC, "gradient_accumulation": 1}, fsdp):
        assert _peak_gradients(spec) <= lora_grads


def test_fsdp_root_unit_stays_unsharded_from_forward_to_the_end_of_backward() -> None:
    """Embeddings, final norm and head (the root unit) are gathered for each micro-batch and
    not resharded after forward: 1 - 1/DP of them beyond this rank's shard, as weights."""
    spec = {**SPEC, "framework": "fsdp", "n_gpus": 4, "gradient_accumulation": 2}
    s = parse_spec(spec)
    tl = run_trace(s)
    root = [n for op, h, n in tl.events if op and tl.category[h] == ROOT]
    assert root == [(2 * V * H + H) * 2] * 4  # two micro-batches, traced and steady-state step
    assert shard_factors(s)[ROOT] == pytest.approx(0.75)
    single = {**spec, "n_gpus": 1, "zero_stage": None}
    tl1 = run_trace(parse_spec(single))
    assert not any(tl1.category[h] == ROOT for op, h, _ in tl1.events if op)
