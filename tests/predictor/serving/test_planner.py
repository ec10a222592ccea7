"""The planner: enumerate, price, choose, explain; and the `snugfit plan --json` contract
(the CLI itself is tested in tests/scheduler/cli/test_plan.py)."""

from __future__ import annotations

import json

import pytest

from predictor.gpus import GPU_NAMES
from predictor.serving import CONTRACT_OPTION_KEYS, EXTRA_OPTION_KEYS, plan
from predictor.spec import parse_spec

CHAT_8B = {
    "id": "chat-8b",
    "model": "llama-3.1-8b",
    "task": "serve",
    "request_rate": 2.0,
    "input_len": 512,
    "output_len": 256,
    "slo_ttft_s": 0.5,
    "slo_tpot_s": 0.05,
}


@pytest.fixture(scope="module")
def chat_plan():  # type: ignore[no-untyped-def]
    return plan(parse_spec(CHAT_8B))


def test_chosen_is_the_cheapest_option_meeting_the_slo(chat_plan) -> None:  # type: ignore[no-untyped-def]
    best = chat_plan.best
    assert best is not None and best.meets_slo and best.status == "CHOSEN"
    meeting = [o for o in chat_plan.options if o.meets_slo]
    assert best.usd_per_hour == min(o.usd_per_hour for o in meeting)
    assert best.point.ttft_p95_s <= 0.5 and best.point.tpot_p95_s <= 0.05
    for o in chat_plan.options:
        assert o.status, "every option explains itself"
        if o is not best:
            assert o.status != "CHOSEN"


def test_small_model_at_low_rate_gets_a_small_slot(chat_plan) -> None:  # type: ignore[no-untyped-def]
    best = chat_plan.best
    assert not best.gpu.startswith("B200")
    assert best.shape.slot.mig is not None or best.gpu.startswith("A100")
    assert best.replicas == 1


def test_numbers_are_consistent(chat_plan) -> None:  # type: ignore[no-untyped-def]
    for o in chat_plan.options:
        assert 0 < o.throughput_at_slo_tok_s <= o.max_throughput_tok_s * 1.0001
        assert o.usd_per_hour == pytest.approx(
            o.replicas * o.n_gpus * o.shape.slot.price_usd_per_hour
        )
        served = 2.0 * 256
        assert o.usd_per_million_tokens == pytest.approx(o.usd_per_hour / (served * 3600) * 1e6)
        assert o.wh_per_million_tokens > 0 and o.cold_start_s > 0
        assert o.replicas * o.throughput_at_slo_tok_s >= served * 0.999


def test_contract_json_has_the_keys_and_bare_gpu_types(chat_plan) -> None:  # type: ignore[no-untyped-def]
    c = chat_plan.to_contract()
    assert set(c) == {"id", "chosen", "options"} and c["id"] == "chat-8b" and c["chosen"] == 0
    for o in c["options"]:
        assert tuple(o) == CONTRACT_OPTION_KEYS + EXTRA_OPTION_KEYS
        # An outside check reads `gpu` as a catalogue type; a MIG slice is named beside it.
        assert o["gpu"] in GPU_NAMES
    migs = {(o.gpu, o.mig_profile) for o in chat_plan.options if o.shape.slot.mig is not None}
    assert migs and all(
        m == o.shape.slot.mig.name for o in chat_plan.options if (m := o.mig_profile)
    )
    assert {(o["gpu"], o["mig_profile"]) for o in c["options"] if o["mig_profile"]} == migs
    assert any(o["mig_profile"] is None for o in c["options"])
    json.dumps(c)


def test_gpu_and_pins_restrict_the_options() -> None:
    only = plan(parse_spec(CHAT_8B), ["H100-80GB"])
    assert {o.shape.slot.gpu.name for o in only.options} == {"H100-80GB"}
    pinned = plan(parse_spec({**CHAT_8B, "gpu": "A100-80GB", "tensor_parallel": 2}))
    assert {(o.gpu, o.shape.tp) for o in pinned.options} == {("A100-80GB", 2)}
    w = plan(parse_spec({**CHAT_8B, "weight_dtype": "fp8"}))
    assert {o.shape.weight.value for o in w.options} == {"fp8"}


def test_allowed_weight_dtypes_widen_the_search_and_fp4_stays_on_blackwell() -> None:
    spec = parse_spec(
        {
            **CHAT_8B,
            "model": "llama-3.3-70b",
            "request_rate": 20.0,
            "slo_ttft_s": None,
            "slo_tpot_s": None,
            "allowed_weight_dtypes": ["bf16", "fp8", "fp4"],
        }
    )
    p = plan(spec)
    weights = {o.shape.weight.value for o in p.options}
    assert weights == {"bf16", "fp8", "fp4"}
    assert all(o.gpu.startswith("B200") for o in p.options if o.shape.weight.value == "fp4")
    assert any("FP4 tensor cores" in why for _, why in p.skipped)


def test_unmeetable_slo_names_the_nearest_option_and_the_miss() -> None:
    p = plan(parse_spec({**CHAT_8B, "slo_tpot_s": 0.001}))
    assert p.chosen is None and p.to_contract()["chosen"] is None
    assert "no option meets the SLO" in p.reason and "nearest is" in p.reason
    assert "slo_tpot_s" in p.reason and "% over" in p.reason
    assert all(o.status.startswith("MISSES SLO") and not o.meets_slo for o in p.options)


def test_engine_flags_realise_the_chosen_option() -> None:
    p = plan(parse_spec({**CHAT_8B, "model": "llama-3.3-70b", "weight_dtype": "fp8"}))
    flags = p.engine_flags()
    vllm = flags["vllm"]
    o = p.best
    assert next(iter(flags)) == "vllm"
    for flag, value in (
        ("--tensor-parallel-size", str(o.shape.tp)),
        ("--max-num-seqs", str(o.max_batch)),
        ("--max-model-len", str(p.spec.max_model_len)),
        ("--kv-cache-dtype", "fp8"),
        ("--quantization", "fp8"),
        ("--gpu-memory-utilization", "0.90"),
    ):
        assert vllm[vllm.index(flag) + 1] == value
    assert "--tp" in flags["sglang"] and "--max_batch_size" in flags["trtllm"]


def test_no_runnable_shape_says_why() -> None:
    p = plan(parse_spec({**CHAT_8B, "weight_dtype": "fp4"}), ["H100-80GB"])
    assert p.chosen is None and not p.options
    assert "no deployment shape can run" in p.reason and "FP4 tensor cores" in p.reason


def test_frontier_trades_latency_for_throughput(chat_plan) -> None:  # type: ignore[no-untyped-def]
    from predictor.serving import frontier, plan_frontiers

    pts = frontier(chat_plan.best, 512, 256)
    assert len(pts) >= 5
    assert [p.tok_s_per_gpu for p in pts] == sorted(p.tok_s_per_gpu for p in pts)
    assert pts[-1].tpot_p95_s > pts[0].tpot_p95_s
    per_type = plan_frontiers(chat_plan)
    assert chat_plan.best.gpu in per_type and all(v["points"] for v in per_type.values())


def test_a_dumped_spec_plans_the_same() -> None:
    """Specs round-trip through JSON (the client and Redis store them so): the defaults a dump
    writes out (tensor_parallel 1, batch_size 1, filled SLOs and weight dtype) pin nothing."""
    spec = parse_spec(
        {**CHAT_8B, "model": "llama-3.3-70b", "allowed_weight_dtypes": ["bf16", "fp8"]}
    )
    again = parse_spec(json.loads(json.dumps(spec.to_dict())))
    a, b = plan(spec).to_contract(), plan(again).to_contract()
    assert a == b and len({o["tensor_parallel"] for o in a["options"]}) > 1
    kv = {(o["weight_dtype"], o["kv_cache_dtype"]) for o in b["options"]}
    assert kv == {("bf16", "bf16"), ("fp8", "fp8")}


def test_engine_values_are_the_chosen_flags_by_placeholder_name() -> None:
    from predictor.serving import ENGINE_PLACEHOLDERS

    p = plan(parse_spec({**CHAT_8B, "model": "llama-3.3-70b", "weight_dtype": "fp8"}))
    values = p.engine_values()
    assert tuple(values) == ENGINE_PLACEHOLDERS
    vllm = p.engine_flags()["vllm"]
    for name in ("tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs"):
        flag = "--" + name.replace("_", "-")
        assert values[name] == vllm[vllm.index(flag) + 1]
    assert values["quantization"] == "fp8" and values["kv_cache_dtype"] == "fp8"
    assert plan(parse_spec(CHAT_8B)).engine_values()["quantization"] == ""
    assert plan(parse_spec({**CHAT_8B, "slo_tpot_s": 0.001})).engine_values() == {}
