"""The OOM retry rule: grow, move past the slot the job had whole, then more tensor
parallelism where the spec permits it, fail when nothing is bigger."""

from __future__ import annotations

import math
from collections.abc import Sequence

from predictor.analytical import predict_table
from predictor.prediction import PredictionTable
from predictor.spec import JobSpec, parse_spec
from scheduler.core.escalation import (
    Escalation,
    escalate_after_oom,
    escalate_oom,
    largest_slot_gib,
)
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from tests.jobs import BIG_70B_FP8
from tests.placement import node, pool_of


def _esc(kind: str, reserved: float, cap: float, largest: float = math.inf):  # type: ignore[no-untyped-def]
    return escalate_after_oom(
        label="X", kind=kind, reserved_gib=reserved, capacity_gib=cap, largest_gib=largest
    )


def test_whole_gpu_oom_moves_past_its_capacity() -> None:
    e = _esc("whole", 30.0, 39.5)
    assert e.possible and e.bigger_slot and e.reserved_gib > 39.5
    assert "bigger GPU type" in e.reason


def test_mig_slice_oom_moves_to_a_larger_slice_or_whole_gpu() -> None:
    e = _esc("mig", 9.0, 9.75)
    assert e.bigger_slot and e.reserved_gib > 9.75 and "larger slice or a whole GPU" in e.reason


def test_shared_oom_grows_within_the_gpu_while_it_fits() -> None:
    e = _esc("shared", 20.0, 79.6)  # the shared GPU holds the grown reservation
    assert not e.bigger_slot and math.isclose(e.reserved_gib, 25.0)
    e2 = _esc("shared", 70.0, 79.6)  # 1.25 x 70 no longer fits the GPU it shared
    assert e2.bigger_slot and e2.reserved_gib > 79.6


def test_nothing_bigger_fails_with_the_reason() -> None:
    e = _esc("whole", 150.0, 178.9, largest=178.9)
    assert not e.possible and "nothing bigger exists" in e.reason


def test_largest_slot_respects_a_pinned_type() -> None:
    pool = pool_of(node("a", "A100-40GB", 1), node("b", "B200-180GB", 1), name="p")
    assert largest_slot_gib(pool) > 170
    assert 39 < largest_slot_gib(pool, "A100-40GB") < 41
    assert largest_slot_gib(pool, "H100-80GB") == 0.0


# -- the last step: more tensor parallelism, where the spec permits it ---------------------------

# 70B in fp8: about 70 GiB per GPU at TP=1 (analytical), so one H100 holds the prediction and an
# OOM there (the truth was bigger) leaves no GPU of an H100 pool that holds the grown floor.
_BIG = {"id": "big", **BIG_70B_FP8}


def _spec(**kw: object) -> JobSpec:
    return parse_spec(_BIG | kw)


def _pool(*counts: int, gpu: str = "H100-80GB") -> Pool:
    return pool_of(*(node(f"n{i}", gpu, c) for i, c in enumerate(counts)), name="p")


def _predict(specs: Sequence[JobSpec]) -> PredictionTable:
    return predict_table(list(specs))


def _oom(
    spec: JobSpec, pool: Pool, reserved: float = 75.0, cap: float = 79.6, gpu: str = "H100-80GB"
) -> Escalation:
    return escalate_oom(
        label=f"{gpu} x{spec.n_gpus}",
        kind="whole",
        reserved_gib=reserved,
        capacity_gib=cap,
        gpu_type=gpu,
        pool=pool,
        spec=spec,
        predict=_predict,
        job_id="big",
    )


def _peak(spec: JobSpec, gpu: str = "H100-80GB") -> float:
    t = predict_table([spec])
    return float(t.peak_vram_gib[0, t.gpu_names.index(gpu)])


def test_no_gpu_holds_it_so_the_retry_doubles_tensor_parallelism() -> None:
    spec = _spec(max_tensor_parallel=8)
    e = _oom(spec, _pool(4))
    retry = e.tensor_parallel
    assert e.possible and e.bigger_slot and retry is not None
    assert (retry.spec.tensor_parallel, retry.spec.n_gpus) == (2, 2)  # the next degree, not 8
    assert retry.spec.max_tensor_parallel == 8 and retry.spec.id == "big"
    assert retry.request.n_gpus == 2 and retry.request.tensor_parallel == 2
    # The grown floor at TP=1 (1.25 x 75 GiB) carried over by the predictor's per-GPU ratio.
    ratio = _peak(retry.spec) / _peak(spec)
    assert 0.4 < ratio < 0.6
    assert math.isclose(e.reserved_gib, 1.25 * 75.0 * ratio, rel_tol=1e-9)
    assert retry.request.reserved_gib == e.reserved_gib
    assert retry.per_gpu_gib >= e.reserved_gib and retry.gpu_type == "H100-80GB"
    assert "at TP=1" in e.reason
    assert f"requeued at TP=2: 2 x {retry.per_gpu_gib:.1f} GiB" in e.reason


def test_data_parallel_is_kept_when_tensor_parallelism_grows() -> None:
    spec = _spec(n_gpus=2, max_tensor_parallel=2)  # two data-parallel replicas at TP=1
    e = _oom(spec, _pool(4))
    assert e.tensor_parallel is not None
    assert (e.tensor_parallel.spec.tensor_parallel, e.tensor_parallel.spec.n_gpus) == (2, 4)
    assert e.tensor_parallel.spec.data_parallel == 2
    assert "requeued at TP=2, n_gpus 4: 4 x" in e.reason


def test_a_degree_the_pool_cannot_hold_is_skipped_for_the_next() -> None:
    # 70B in bf16 OOMed with all of a lone H200: at TP=2 each GPU needs ~88 GiB, more than an
    # H100 and no node has two H200s; TP=4 (~45 GiB) fits the 4-GPU H100 node.
    pool = pool_of(node("a", "H200-141GB", 1), node("b", "H100-80GB", 4), name="p")
    spec = _spec(weight_dtype="bf16", max_tensor_parallel=8)
    e = _oom(spec, pool, reserved=140.0, cap=140.5, gpu="H200-141GB")
    assert e.tensor_parallel is not None and e.tensor_parallel.spec.tensor_parallel == 4
    assert e.tensor_parallel.gpu_type == "H100-80GB"
    assert "requeued at TP=4: 4 x" in e.reason


def test_a_bigger_gpu_type_comes_before_more_tensor_parallelism() -> None:
    pool = pool_of(node("a", "H100-80GB", 4), node("b", "H200-141GB", 1), name="p")
    e = _oom(_spec(max_tensor_parallel=8), pool)
    assert e.possible and e.tensor_parallel is None and "bigger GPU type" in e.reason


def test_tensor_parallel_at_its_max_fails_at_once() -> None:
    spec = _spec(tensor_parallel=2, n_gpus=2, max_tensor_parallel=2)
    e = _oom(spec, _pool(4), reserved=45.0)
    assert not e.possible and e.tensor_parallel is None
    assert "nothing bigger exists" in e.reason and "TP=2 is the `max_tensor_parallel`" in e.reason


def test_a_pool_without_a_node_for_the_gang_fails_at_once() -> None:
    e = _oom(_spec(max_tensor_parallel=4), _pool(1, 1, 1, 1))  # four 1-GPU nodes
    assert not e.possible and e.tensor_parallel is None
    assert "nor at a higher tensor parallel degree up to its `max_tensor_parallel` 4" in e.reason
    assert "TP=2 needs 2 x" in e.reason and "no node has 2 GPUs" in e.reason
    assert "TP=4 needs 4 x" in e.reason


def test_without_permission_the_reason_says_how_to_give_it() -> None:
    e = _oom(_spec(), _pool(4))
    assert not e.possible and e.tensor_parallel is None
    assert "set `max_tensor_parallel`" in e.reason


def test_a_pinned_type_bounds_the_retry_too() -> None:
    pool = pool_of(node("a", "H100-80GB", 1), node("b", "A100-80GB", 2), name="p")
    # Pinned to H100s, of which no node has two: the A100 node does not count.
    e = _oom(_spec(gpu="H100-80GB", max_tensor_parallel=2), pool)
    assert not e.possible and "no node has 2 GPUs" in e.reason
    free = _oom(_spec(max_tensor_parallel=2), pool)
    assert free.tensor_parallel is not None and free.tensor_parallel.gpu_type == "A100-80GB"


def test_largest_slot_counts_only_nodes_that_hold_the_gang() -> None:
    pool = pool_of(node("a", "H100-80GB", 4), node("b", "B200-180GB", 1), name="p")
    assert largest_slot_gib(pool, n_gpus=1) > 170
    assert 79 < largest_slot_gib(pool, n_gpus=2) < 81
    assert largest_slot_gib(pool, n_gpus=8) == 0.0


def test_the_core_requeues_the_retry_request_in_its_turn() -> None:
    from scheduler.core.clock import VirtualClock
    from scheduler.core.loop import SchedulerCore
    from scheduler.policies.registry import get_policy

    pool = _pool(4)
    spec = _spec(max_tensor_parallel=2)
    req = PlacementRequest.from_table(spec, predict_table([spec]), 0, submit_time_s=5.0)
    core = SchedulerCore(pool.state(), get_policy("rightsize"), VirtualClock(10.0))
    core.submit(req)
    (d,) = core.tick()
    assert d.state == "placed" and d.chosen_option is not None
    opt = d.chosen_option
    e = escalate_oom(label=opt.label, kind=opt.kind, reserved_gib=opt.reserved_gib,
                     capacity_gib=opt.capacity_gib, gpu_type=opt.gpu_type, pool=pool,
                     spec=spec, predict=_predict, job_id=req.job_id)  # fmt: skip
    assert e.tensor_parallel is not None
    again = core.oom(req.job_id, e.reserved_gib, e.tensor_parallel.request)
    assert again.n_gpus == 2 and again.submit_time_s == 5.0  # it keeps its place
    (d2,) = core.tick()
    assert d2.state == "placed" and d2.chosen_option is not None
    assert d2.chosen_option.n_gpus == 2 and d2.chosen_option.reserved_gib >= e.reserved_gib


def test_a_multi_node_gang_escalates_to_a_bigger_type_that_holds_the_gang() -> None:
    def nodes(gpu: str, count: int, k: int) -> list[dict[str, object]]:
        return [{"name": f"{gpu[:4]}-{i}", "gpu": gpu, "count": count} for i in range(k)]

    spec = parse_spec(
        {
            "id": "g",
            "model": "llama-3.1-8b",
            "task": "inference",
            "batch_size": 8,
            "input_len": 512,
            "output_len": 128,
            "num_requests": 10,
            "n_gpus": 16,
            "tensor_parallel": 8,
        }
    )
    both = Pool.from_dict(
        {"name": "p", "nodes": nodes("H100-80GB", 8, 2) + nodes("H200-141GB", 8, 2)}
    )
    # 16 GPUs fit no node, but two 8-GPU nodes of either type hold the gang.
    assert 140 < largest_slot_gib(both, n_gpus=16, tensor_parallel=8) < 142
    assert largest_slot_gib(both, n_gpus=16, tensor_parallel=16) == 0.0  # TP must fit a node
    kw = {"label": "H100-80GB x16", "kind": "whole", "reserved_gib": 60.0}
    e = escalate_oom(capacity_gib=79.6, gpu_type="H100-80GB", pool=both, spec=spec, **kw)
    assert e.possible and e.bigger_slot and e.reserved_gib > 79.6 and e.tensor_parallel is None
    # One H200 node cannot hold 16 GPUs and alone is no gang: nothing bigger holds it.
    one = Pool.from_dict(
        {"name": "p", "nodes": nodes("H100-80GB", 8, 2) + nodes("H200-141GB", 8, 1)}
    )
    e1 = escalate_oom(capacity_gib=79.6, gpu_type="H100-80GB", pool=one, spec=spec, **kw)
    assert not e1.possible and "nothing bigger exists" in e1.reason
