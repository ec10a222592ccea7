"""The closed-form queueing model against a discrete-event run of the same replica."""

from __future__ import annotations

import pytest

from predictor.gpus import get_gpu
from predictor.models import resolve_model
from predictor.serving._des import simulate_replica
from predictor.serving._perf import Slot, replica_perf
from predictor.serving._queueing import load_point, max_rate
from predictor.spec import DType, Framework

CASES = {
    "8b-h100-bf16-512/256": ("llama-3.1-8b", "H100-80GB", 1, DType.BF16, DType.BF16, 512, 256),
    "70b-h100x2-fp8-1024/256": ("llama-3.3-70b", "H100-80GB", 2, DType.FP8, DType.FP8, 1024, 256),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("load", [0.2, 0.5, 0.8])
def test_p95_latencies_agree_with_a_discrete_event_run(case: str, load: float) -> None:
    model, gpu, tp, w, kv, i, o = CASES[case]
    perf = replica_perf(resolve_model(model), Slot(get_gpu(gpu)), tp, w, kv, Framework.VLLM)
    rate = load * max_rate(perf.iteration_s, 256, i, o)
    closed = load_point(perf.iteration_s, rate, 256, i, o)
    sim = simulate_replica(perf.iteration_s, rate, 256, i, o, n_requests=1500, seed=1)
    assert sim.completed == 1500
    assert closed.tpot_p95_s == pytest.approx(sim.tpot_p95_s, rel=0.15)
    assert closed.ttft_p95_s == pytest.approx(sim.ttft_p95_s, rel=0.30)
    assert closed.running == pytest.approx(sim.mean_running, rel=0.25)
