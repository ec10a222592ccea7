"""Limiting cases of the operator-class roofline and the serving-time API (predictor.engine)."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import efficiency
from predictor._checks import PAGED_32BIT_NOTE, check_rows
from predictor._fit import fit_efficiencies
from predictor._jobarrays import job_arrays
from predictor._memory import GIB, MemoryModel, memory_breakdown_gib
from predictor._runtime import BOOST_CLOCK_MHZ, RuntimeModel, latency_scale, roofline_share
from predictor.analytical import AnalyticalPredictor, predict
from predictor.efficiency import PARAMETERS, Efficiencies, efficiency_table_text
from predictor.engine import (
    check_dtype_supported,
    compute_dtype_supported,
    decode_step_time_s,
    engine_overheads,
    prefill_time_s,
)
from predictor.exceptions import SpecError
from predictor.gpus import get_gpu
from predictor.measurements import measurement_row, parse_measurement
from predictor.spec import parse_spec

MODEL = "llama-2-7b"


def _weights_bytes(model: str, gpu: str = "H100-80GB") -> float:
    spec = parse_spec({"model": model, "task": "inference", "input_len": 8, "output_len": 8})
    bd = memory_breakdown_gib(job_arrays([spec]), (gpu,), MemoryModel())
    return float(bd["weights"][0, 0]) * GIB


def test_decode_at_batch_one_is_bandwidth_bound() -> None:
    eff = efficiency.default_efficiencies()
    for gpu in ("A100-80GB", "H100-80GB", "B200-180GB"):
        g = get_gpu(gpu)
        t = float(decode_step_time_s(MODEL, gpu, 1, 128, framework="vllm"))
        floor = _weights_bytes(MODEL, gpu) / (g.hbm_bandwidth_gbps * 1e9)
        ov = engine_overheads("vllm")
        overhead = ov.step_s + ov.seq_step_s + 32 * eff["launch.decode_engine_s"]
        mbu = eff[f"decode.mbu.{efficiency.gpu_architecture(gpu)}"]
        # time = weight bytes / (HBM bandwidth × MBU) + fixed overhead (KV of 128 tokens ≈ 0)
        assert t == pytest.approx(floor / mbu + overhead, rel=0.05)
        assert t > floor


def test_decode_grows_with_running_batch_and_kv_read() -> None:
    t = decode_step_time_s(MODEL, "H100-80GB", np.array([1, 16, 64, 256]), 2048)
    assert np.all(np.diff(t) > 0)
    short, long = decode_step_time_s(MODEL, "H100-80GB", 32, np.array([256, 8192]))
    assert long > short
    # With short contexts small batches barely cost more than batch 1: weights dominate.
    b1, b16 = decode_step_time_s(MODEL, "H100-80GB", np.array([1, 16]), 128)
    assert b16 < 1.5 * b1


def test_prefill_of_a_long_prompt_is_compute_bound() -> None:
    eff = efficiency.default_efficiencies()
    gpu = get_gpu("H100-80GB")
    spec = parse_spec({"model": MODEL, "task": "inference", "input_len": 8192, "output_len": 1})
    flops = 2.0 * float(job_arrays([spec]).flop_params[0]) * 8 * 8192
    t = float(prefill_time_s(MODEL, "H100-80GB", 8, 8192))
    compute_floor = flops / (gpu.peak_tflops["bf16"] * 1e12)
    weight_read = _weights_bytes(MODEL) / (gpu.hbm_bandwidth_gbps * 1e9)
    assert t > compute_floor > 50 * weight_read
    # Within the GEMM efficiency band plus attention: not launch- or bandwidth-limited.
    assert t < compute_floor / (0.5 * eff["prefill.hopper"]) + 0.5
    # Doubling the tokens at least doubles the time (attention grows quadratically).
    assert float(prefill_time_s(MODEL, "H100-80GB", 16, 8192)) >= 1.95 * t


def test_h100_over_a100_decode_ratio_is_the_bandwidth_ratio() -> None:
    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100-80GB")
    bw_ratio = h100.hbm_bandwidth_gbps / a100.hbm_bandwidth_gbps
    flop_ratio = h100.peak_tflops["bf16"] / a100.peak_tflops["bf16"]
    for framework in ("vllm", "trtllm", "hf"):
        r = float(
            decode_step_time_s(MODEL, "A100-80GB", 1, 512, framework=framework)
            / decode_step_time_s(MODEL, "H100-80GB", 1, 512, framework=framework)
        )
        assert abs(r - bw_ratio) < abs(r - flop_ratio)
        # GPU-independent engine overheads pull it below the bandwidth ratio, never above.
        assert 1.0 < r <= bw_ratio * 1.05


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB", "B200-180GB"])
@pytest.mark.parametrize(
    "shape",
    [
        {"task": "inference", "batch_size": 1, "input_len": 128, "output_len": 128},
        {"task": "inference", "batch_size": 32, "input_len": 4096, "output_len": 256},
        {"task": "pretrain", "batch_size": 1, "seq_len": 4096},
        {"task": "pretrain", "batch_size": 8, "seq_len": 8192, "gradient_accumulation": 4},
    ],
)
def test_tp8_is_never_more_than_8x_faster_than_tp1(gpu: str, shape: dict) -> None:
    base = {"model": "llama-3.1-70b", "weight_dtype": "bf16", **shape}
    one = predict([parse_spec({**base, "n_gpus": 1})], [gpu])[0]
    eight = predict([parse_spec({**base, "n_gpus": 8, "tensor_parallel": 8})], [gpu])[0]
    for field in ("ttft_s", "tpot_s", "step_time_s"):
        a, b = getattr(one, field), getattr(eight, field)
        if a is not None:
            assert a / b <= 8.0, (field, a / b)
            assert b < a  # and TP helps on one node


def test_collectives_scale_with_message_and_group() -> None:
    from predictor._runtime import allreduce_s

    eff = efficiency.default_efficiencies()
    link = np.array([[450e9]])
    small, big = (
        allreduce_s(np.array([[1e3]]), np.array([[8.0]]), link, eff),
        allreduce_s(np.array([[1e9]]), np.array([[8.0]]), link, eff),
    )
    assert big > 100 * small
    two, eight = (allreduce_s(np.array([[1e9]]), np.array([[p]]), link, eff) for p in (2.0, 8.0))
    assert eight > two  # 2(p-1)/p of the bytes: 1.75 vs 1.0
    assert allreduce_s(np.array([[1e9]]), np.array([[1.0]]), link, eff).item() == 0.0


def test_recompute_costs_one_extra_forward() -> None:
    ft = {"model": MODEL, "task": "pretrain", "batch_size": 4, "seq_len": 2048}
    plain = predict([parse_spec(ft)], ["H100-80GB"])[0].step_time_s
    ckpt = predict([parse_spec({**ft, "gradient_checkpointing": True})], ["H100-80GB"])[0]
    assert plain is not None and ckpt.step_time_s is not None
    assert 1.2 < ckpt.step_time_s / plain < 1.4  # 8N/6N = 1.33 for the GEMMs


def test_low_precision_paths_only_where_the_gpu_has_them() -> None:
    assert not compute_dtype_supported("A100-80GB", "fp8")
    assert compute_dtype_supported("H100-80GB", "fp8")
    assert not compute_dtype_supported("H200-141GB", "fp4")
    assert compute_dtype_supported("B200-180GB", "fp4")
    assert compute_dtype_supported("A100-40GB", "bf16")
    with pytest.raises(SpecError, match="needs Hopper"):
        check_dtype_supported("A100-80GB", "fp8")
    with pytest.raises(SpecError, match="Blackwell"):
        prefill_time_s(MODEL, "H100-80GB", 1, 128, compute_dtype="fp4")
    # FP8 weights on A100 run weight-only: bf16 GEMMs, half the bytes to read.
    bf16 = decode_step_time_s(MODEL, "A100-80GB", 1, 128)
    fp8 = decode_step_time_s(MODEL, "A100-80GB", 1, 128, weight_dtype="fp8")
    assert fp8 < bf16
    # FP8 compute on H100 prefills faster than bf16.
    assert prefill_time_s(MODEL, "H100-80GB", 8, 4096, weight_dtype="fp8") < prefill_time_s(
        MODEL, "H100-80GB", 8, 4096
    )


def test_engine_overheads_per_framework() -> None:
    for fw in ("vllm", "sglang", "trtllm", "hf"):
        ov = engine_overheads(fw)
        assert ov.framework == fw and ov.step_s > 0 and ov.request_s > 0
    assert engine_overheads("peft").framework == "hf"
    assert engine_overheads("torchtune").framework == "other"


def test_efficiency_table_names_every_parameter_and_its_kind() -> None:
    text = efficiency_table_text()
    for p in PARAMETERS:
        assert p.name in text
    assert "fitted" in text and "quoted" in text
    with pytest.raises(ValueError, match="unknown efficiency parameter"):
        Efficiencies({"gemm.nonsense": 1.0})


def _row(i: int, batch: int, ttft: float, tpot: float, runtime: float | None = None) -> dict:
    return measurement_row(
        id=f"r{i}",
        origin="published",
        source="table-x | somewhere",
        spec={
            "model": MODEL,
            "task": "inference",
            "batch_size": batch,
            "input_len": 512,
            "output_len": 128,
        },
        gpu="H100-80GB",
        ttft_s=ttft,
        tpot_s=tpot,
        runtime_s=runtime,
    )


def test_data_checks_flag_physics_and_sibling_contradictions() -> None:
    rows = [
        _row(0, 8, 0.20, 0.010, 0.20 + 127 * 0.010),  # consistent
        _row(1, 32, 0.80, 0.012, 0.3),  # runtime below TTFT + 127·TPOT
        _row(2, 64, 0.05, 0.013),  # TTFT 16x below batch 32's, and above peak FLOP/s
        _row(3, 1, 0.03, 0.0005),  # TPOT below one weight read at peak bandwidth
    ]
    found = {(f.id, f.check) for f in check_rows(rows)}
    assert ("r0", "runtime-lt-parts") not in found and not any(i == "r0" for i, _ in found)
    assert ("r1", "runtime-lt-parts") in found
    assert ("r2", "sibling-batch") in found and ("r2", "peak-flops") in found
    assert ("r3", "hbm-bandwidth") in found


def test_fit_explains_the_rows_and_keeps_uninformed_priors() -> None:
    """Rows generated with gemm.hopper = 0.4 (prior 0.62): the fitted table reproduces them
    far better than the priors; parameters no row informs stay at their priors."""
    truth = efficiency.prior_efficiencies().with_values({"gemm.hopper": 0.4})
    specs = [
        {"model": m, "task": "pretrain", "batch_size": b, "seq_len": n}
        for m in (MODEL, "llama-3.1-8b", "qwen2.5-7b")
        for b in (1, 2, 4, 8)
        for n in (1024, 2048, 4096)
    ]
    rows = []
    for k, s in enumerate(specs):
        p = AnalyticalPredictor(runtime_model=RuntimeModel(truth)).predict(
            [parse_spec(s)], ["H100-80GB"]
        )[0]
        rows.append(
            parse_measurement(
                measurement_row(
                    id=f"s{k}",
                    origin="profile",
                    source="synthetic | test",
                    spec=s,
                    gpu="H100-80GB",
                    step_time_s=p.step_time_s,
                )
            )
        )
    fitted = fit_efficiencies(rows)

    def mape(eff: Efficiencies) -> float:
        preds = AnalyticalPredictor(runtime_model=RuntimeModel(eff)).predict(
            [m.spec for m in rows], ["H100-80GB"]
        )
        errs = [
            abs((p.step_time_s or 0.0) / (m.step_time_s or 1.0) - 1)
            for m, p in zip(rows, preds, strict=True)
        ]
        return float(np.mean(errs))

    # The prior still pulls, but the fit removes most of the error.
    assert mape(fitted) < 0.4 * mape(efficiency.prior_efficiencies())
    assert fitted["engine.step_s.vllm"] == pytest.approx(
        efficiency.prior_efficiencies()["engine.step_s.vllm"], rel=0.01
    )


def test_out_of_source_predictor_uses_the_table_that_left_the_source_out() -> None:
    from predictor._fit import OutOfSourceAnalytical

    spec = {"model": MODEL, "task": "pretrain", "batch_size": 4, "seq_len": 2048}
    m = parse_measurement(
        measurement_row(
            id="row-a",
            origin="published",
            source="src-a | x",
            spec={**spec, "id": "a"},
            gpu="H100-80GB",
            step_time_s=1.0,
        )
    )
    slow = efficiency.prior_efficiencies().with_values({"gemm.hopper": 0.2})
    oos = OutOfSourceAnalytical.from_measurements([m], {"src-a": slow})
    other = parse_spec({**spec, "id": "b"})
    t = oos.predict_table([m.spec, other], ["H100-80GB"])
    assert t.step_time_s[0, 0] > 1.5 * t.step_time_s[1, 0]  # row a: the held-out table
    default = predict([other], ["H100-80GB"])[0].step_time_s
    assert t.step_time_s[1, 0] == pytest.approx(default)  # anything else: the default


@pytest.mark.parametrize("framework", ["hf", "other"])
def test_eager_collectives_are_barriers_that_grow_with_the_group(framework: str) -> None:
    """Without CUDA graphs every TP rank issues its kernels from its own host process, so each
    all-reduce waits for the slowest rank: its host cost grows with log2(TP). Captured engines
    do not pay it."""
    base = efficiency.prior_efficiencies()
    slow = base.with_values({"comm.uncaptured_latency_s": 1e-4})

    def extra(fw: str, tp: int) -> float:
        kw = {"tensor_parallel": tp, "framework": fw}
        a = decode_step_time_s("llama-2-70b", "H100-80GB", 1, 512, eff=slow, **kw)
        b = decode_step_time_s("llama-2-70b", "H100-80GB", 1, 512, eff=base, **kw)
        return float(a - b)

    layers = 80
    # The prior is an A100 figure; a faster-clocked GPU pays it scaled by 1 / clock.
    per_call = (1e-4 - base["comm.uncaptured_latency_s"]) * latency_scale("H100-80GB")
    for tp, depth in ((2, 1.0), (4, 2.0), (8, 3.0)):
        assert extra(framework, tp) == pytest.approx(2 * layers * per_call * depth, rel=1e-6)
    assert extra("vllm", 8) == 0.0


def test_roofline_share_limits() -> None:
    """A GEMM far above its ridge point runs at its compute-bound rate; far below it, its time
    is one read of the weights (share = tokens / ridge). p = 1 sums the two times, a large p
    takes their maximum (the ideal roofline), and p in between lies between the two."""
    ridge = 300.0
    assert roofline_share(np.array(1e7), ridge, 2.0) == pytest.approx(1.0, rel=1e-4)
    assert roofline_share(np.array(1.0), ridge, 2.0) == pytest.approx(1.0 / ridge, rel=1e-4)
    t = np.array([10.0, 300.0, 3000.0])
    assert np.allclose(roofline_share(t, ridge, 1.0), t / (t + ridge))
    assert np.allclose(roofline_share(t, ridge, 64.0), np.minimum(1.0, t / ridge), rtol=0.02)
    s1, s2, s4 = (roofline_share(t, ridge, p) for p in (1.0, 2.0, 4.0))
    assert np.all(s1 < s2) and np.all(s2 < s4)
    # At the ridge itself: half the compute rate when the times add, 1/sqrt(2) for p = 2.
    assert float(roofline_share(np.array(ridge), ridge, 2.0)) == pytest.approx(2**-0.5)


def test_latency_bound_decode_follows_the_clock_not_the_bandwidth() -> None:
    """An eager (no CUDA graphs) TP8 decode of a 7B model is dominated by per-layer launch
    floors and per-collective syncs, not by its 1.7 GB weight shard: with the engine's CPU work
    set to its floor, the A100/H100 step ratio approaches the boost-clock ratio (1980/1410),
    not the HBM-bandwidth ratio (3350/2039) nor 1 (GPU-independent fixed costs)."""
    eff = efficiency.prior_efficiencies().with_values(
        {"engine.step_s.other": 1e-5, "engine.seq_step_s.other": 1e-7}
    )
    kw = {"tensor_parallel": 8, "framework": "other", "eff": eff}
    a100 = float(decode_step_time_s(MODEL, "A100-80GB", 1, 128, **kw))
    h100 = float(decode_step_time_s(MODEL, "H100-80GB", 1, 128, **kw))
    clock = BOOST_CLOCK_MHZ["hopper"] / BOOST_CLOCK_MHZ["ampere"]
    bw = get_gpu("H100-80GB").hbm_bandwidth_gbps / get_gpu("A100-80GB").hbm_bandwidth_gbps
    assert a100 / h100 == pytest.approx(clock, rel=0.08)
    assert a100 / h100 < bw - 0.15
    assert latency_scale("A100-40GB") == 1.0
    assert latency_scale("H200-141GB") == latency_scale("H100-80GB") == pytest.approx(1 / clock)


def test_gemm_token_knee_is_the_gpus_ridge_point() -> None:
    """A prompt shorter than the ridge point (peak FLOP/s over HBM bytes/s, ~150 tokens on
    A100, ~300 on H100) is bandwidth-bound: its prefill costs about one read of the weights on
    every GPU (times a GPU-independent factor for the GEMMs' large-size efficiency and the
    fixed overheads), not a multiple that depends on a fixed token knee (which made A100 1.7x
    worse than H100 here)."""
    eff = efficiency.prior_efficiencies()
    shares = []
    for gpu in ("A100-80GB", "H100-80GB"):
        g = get_gpu(gpu)
        ridge = g.peak_tflops["bf16"] * 1e12 / (g.hbm_bandwidth_gbps * 1e9)
        read = _weights_bytes(MODEL, gpu) / (g.hbm_bandwidth_gbps * 1e9)
        t = float(prefill_time_s(MODEL, gpu, 1, int(ridge / 4), framework="vllm", eff=eff))
        shares.append(t / read)
        # Well above the ridge the GEMMs are compute-bound: 8x the tokens, > 5x the time.
        long = float(prefill_time_s(MODEL, gpu, 1, int(8 * ridge), framework="vllm", eff=eff))
        assert long > 5.0 * read
    assert all(1.0 < s < 3.5 for s in shares), shares
    assert max(shares) / min(shares) < 1.3, shares


def test_moe_decode_reads_only_the_experts_the_batch_routes_to() -> None:
    """gpt-oss-120b routes each token to 4 of 128 experts in every MoE layer: a batch-1 step
    reads the shared weights plus about 3% of the experts, far less than the whole model; a
    batch of 64 touches most experts (1 − (1 − 4/128)^64 ≈ 87%)."""
    gpu = get_gpu("H100-80GB")
    eff = efficiency.prior_efficiencies()
    full_read = _weights_bytes("gpt-oss-120b") / (gpu.hbm_bandwidth_gbps * 1e9 * 0.7)
    b1, b64 = decode_step_time_s("gpt-oss-120b", "H100-80GB", np.array([1, 64]), 512, eff=eff)
    assert b1 < 0.25 * full_read
    assert b64 > 3.0 * b1
    assert b64 < 1.2 * full_read + 0.01


def test_moe_training_pays_dispatch_and_combine_all_to_alls() -> None:
    """Each MoE layer sends every token's k routed copies to the experts' GPUs and back (4
    all-to-alls per micro-batch, fwd + bwd). One GPU sends nothing; over 8 data-parallel ranks
    the bytes follow k·hidden; a dense model pays none."""
    from predictor._runtime import _gpus, _moe_alltoall_s

    eff = efficiency.prior_efficiencies()
    g = _gpus([get_gpu("H100-80GB")], eff)
    shape = {"task": "pretrain", "batch_size": 1, "seq_len": 4096, "weight_dtype": "bf16"}

    def a2a(model: str, n: int) -> float:
        j = job_arrays([parse_spec({"model": model, "n_gpus": n, **shape})])
        return float(_moe_alltoall_s(j, g, eff, j.checkpointing)[0, 0])

    assert a2a("qwen3-30b-a3b", 1) == 0.0
    assert a2a("llama-3-8b", 8) == 0.0
    t = a2a("qwen3-30b-a3b", 8)
    # 48 layers × 4 calls × (4096 tokens × 8 experts × 2048 × 2 bytes × 7/8) over the link.
    link = get_gpu("H100-80GB").nvlink_bandwidth_gbps / 2 * 1e9 * eff["comm.link_efficiency"]
    expected = 48 * 4 * (eff["comm.latency_s"] + 4096 * 8 * 2048 * 2 * 7 / 8 / link)
    assert t == pytest.approx(expected, rel=1e-6)
    # Its share of the step is far larger than for a coarse MoE with more compute per token.
    step = predict([parse_spec({"model": "qwen3-30b-a3b", "n_gpus": 8, **shape})], ["H100-80GB"])
    assert 0.05 < t / step[0].step_time_s < 0.8


def _vram_row(i: int, peak: float, notes: str = "", **spec: object) -> dict:
    return measurement_row(
        id=f"v{i}",
        origin="published",
        source="table-v | somewhere",
        spec={"model": "llama-2-70b", "task": "lora", "batch_size": 4, "seq_len": 4096, **spec},
        gpu="A100-80GB",
        gpu_memory_gib=80.0,
        peak_vram_gib=peak,
        notes=notes,
    )


def test_vram_checks_flag_a_peak_below_its_floor_and_paged_states_over_capacity() -> None:
    """70B on 8 GPUs (ZeRO-3): ~16 GiB of weights per GPU, and 80 layers x 4 x 4096 x 8192
    bf16 checkpointed inputs = 20 GiB; a 24.6 GiB reading cannot hold both."""
    z3 = {"n_gpus": 8, "zero_stage": 3, "lora_rank": 16}
    rows = [
        _vram_row(0, 24.6, gradient_checkpointing=True, **z3),  # below the floor
        _vram_row(1, 40.0, gradient_checkpointing=True, **z3),  # above it
        _vram_row(2, 24.6, gradient_checkpointing=False, **z3),  # no floor without checkpoints
        _vram_row(
            3,
            65.6,
            PAGED_32BIT_NOTE,
            task="full_finetune",
            gradient_checkpointing=True,
            n_gpus=8,
            zero_stage=3,
        ),
    ]
    found = {(f.id, f.check) for f in check_rows(rows)}
    assert found == {("v0", "vram-floor"), ("v3", "paged-over-capacity")}
