"""Inter-node traffic (predictor.internode): the pipeline's activations between stages on
different nodes, by hand arithmetic, and its limiting cases (no pipeline, one node)."""

from __future__ import annotations

import pytest

from predictor.efficiency import default_efficiencies
from predictor.internode import GradientSync, gradient_sync, internode_pipeline_s
from predictor.models import resolve_model
from predictor.spec import JobSpec
from tests.jobs import gang_finetune_spec

# One micro-batch of 4 x 2048 tokens at hidden 4096 in bf16 crosses a stage boundary.
ACT = 4 * 2048 * 4096 * 2.0


def _sync(pp: int, tp: int, *, micro: float = 8.0, steps: float = 100.0) -> GradientSync:
    return GradientSync(
        steps=steps,
        data_parallel=1,
        pipeline_parallel=pp,
        tensor_parallel=tp,
        activation_bytes=ACT,
        micro_batches=micro,
    )


def test_pipeline_activations_between_nodes_by_hand() -> None:
    eff = default_efficiencies()
    link = 400.0 / 8.0 * 1e9 * eff["comm.link_efficiency"]  # bytes/s one node sends
    lat = eff["comm.latency_s"]
    # PP=2, TP=8 on two 8-GPU nodes: one stage per node, one TP group (one replica) per node,
    # so each hop carries one activation; 8 micro-batches + 1 bubble slot, forward and back.
    one = 2.0 * (lat + ACT / link) * (8 + 2 - 1) * 100
    assert internode_pipeline_s(_sync(2, 8), 8, 2, 400.0) == pytest.approx(one)
    # PP=2, TP=4: each node holds two TP groups of its stage (two data-parallel replicas), and
    # both send their activation over the node's one link: twice the bytes per hop.
    two = 2.0 * (lat + 2 * ACT / link) * (8 + 2 - 1) * 100
    assert internode_pipeline_s(_sync(2, 4), 8, 2, 400.0) == pytest.approx(two)
    # PP=4, TP=4 on two nodes: two stages per node, only the middle boundary crosses; the
    # crossing stage has one TP group (stage = 16 / 4 = 4 GPUs); 3 bubble slots.
    mid = 2.0 * (lat + ACT / link) * (8 + 4 - 1) * 100
    assert internode_pipeline_s(_sync(4, 4), 8, 2, 400.0) == pytest.approx(mid)
    # An 8x faster network moves the bytes 8x faster (the latency stays).
    fast = internode_pipeline_s(_sync(2, 8), 8, 2, 3200.0)
    assert fast == pytest.approx(2.0 * (lat + ACT / (8 * link)) * 9 * 100)


def test_pipeline_inside_one_node_or_no_pipeline_charges_nothing() -> None:
    # PP=2 x TP=4 inside one 8-GPU node: every boundary is NVLink, nothing on the network.
    assert internode_pipeline_s(_sync(2, 4), 8, 1, 400.0) == 0.0
    # No pipeline across two nodes (pure data parallel): no activations cross.
    assert internode_pipeline_s(_sync(1, 8), 8, 2, 400.0) == 0.0
    # Inference (no steps) sends nothing.
    assert internode_pipeline_s(_sync(2, 8, steps=0.0), 8, 2, 400.0) == 0.0


def test_gradient_sync_carries_the_pipeline_figures_of_the_spec() -> None:
    spec = JobSpec.model_validate(
        gang_finetune_spec("pp", steps=100, gradient_accumulation=8, pipeline_parallel=2)
    )
    (s,) = gradient_sync([spec])
    assert resolve_model("llama-3.1-8b").hidden_size == 4096
    assert (s.pipeline_parallel, s.tensor_parallel, s.data_parallel) == (2, 8, 1)
    assert s.activation_bytes == ACT and s.micro_batches == 8.0 and s.steps == 100.0
    # Two stages on two nodes pay the network; the same job split inside one node would not.
    assert internode_pipeline_s(s, 8, 2, 400.0) > 0.0
    assert internode_pipeline_s(s, 16, 1, 400.0) == 0.0
