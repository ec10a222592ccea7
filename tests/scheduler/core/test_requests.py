"""Placement requests: validation, building from a PredictionTable, and the one definition of
the whole GPU a user would request (the live service and the simulator both use it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predictor.gpus import GPU_NAMES
from predictor.prediction import PredictionTable
from predictor.spec import parse_spec
from scheduler.core.pool import Pool
from scheduler.core.requests import HABITUAL_GPU, PlacementRequest, requested_type
from scheduler.exceptions import PlacementError


def test_from_table_carries_the_busy_fraction() -> None:
    from predictor.analytical import predict_table

    spec = parse_spec({"id": "s", "model": "qwen2.5-0.5b", "task": "inference", "batch_size": 1})
    table = predict_table([spec])
    assert table.busy_frac is not None and np.all((table.busy_frac >= 0) & (table.busy_frac <= 1))
    req = PlacementRequest.from_table(spec, table, 0)
    assert req.busy_frac[GPU_NAMES.index("H100-80GB")] == pytest.approx(
        table.busy_frac[0, table.gpu_names.index("H100-80GB")]
    )


def test_request_validation() -> None:
    with pytest.raises(PlacementError, match="one value per GPU type"):
        PlacementRequest("j", [1.0], [1.0], [1.0], [1.0])
    with pytest.raises(PlacementError, match="multiple of"):
        PlacementRequest("j", *([[10.0] * 5] * 4), n_gpus=3, tensor_parallel=2)
    with pytest.raises(PlacementError, match="not a GPU type"):
        PlacementRequest("j", *([[10.0] * 5] * 4), gpu="H100")


def test_from_table_aligns_columns_and_defaults() -> None:
    spec = parse_spec({"id": "x", "model": "llama-3.1-8b", "task": "inference"})
    names = ("H100-80GB", "A100-40GB")
    arr = np.array([[20.0, 21.0]])
    table = PredictionTable(
        job_ids=("x",),
        gpu_names=names,
        peak_vram_gib=arr,
        peak_vram_upper_gib=arr + 2,
        runtime_s=np.array([[100.0, 300.0]]),
        runtime_upper_s=np.array([[120.0, 360.0]]),
        breakdown_gib={"overhead": np.zeros((1, 2))},
        step_time_s=np.full((1, 2), np.nan),
        ttft_s=np.full((1, 2), np.nan),
        tpot_s=np.full((1, 2), np.nan),
        fits=np.ones((1, 2), bool),
        method=("analytical",),
    )
    r = PlacementRequest.from_table(spec, table, 0, submit_time_s=5.0)
    assert r.job_id == "x"
    assert r.vram_upper_gib[GPU_NAMES.index("H100-80GB")] == 22.0
    assert r.vram_upper_gib[GPU_NAMES.index("A100-40GB")] == 23.0
    assert math.isinf(r.vram_upper_gib[GPU_NAMES.index("B200-180GB")])
    assert r.requested_gpu == "H100-80GB"
    assert r.submit_time_s == 5.0


def _upper(**by_type: float) -> np.ndarray:
    out = np.full(len(GPU_NAMES), 10.0)
    for name, v in by_type.items():
        out[GPU_NAMES.index(name.replace("_", "-"))] = v
    return out


def test_requested_type_is_the_habit_when_the_job_fits_it() -> None:
    assert requested_type(_upper(), 1) == HABITUAL_GPU == "H100-80GB"
    assert requested_type(_upper(), 1, "A100-40GB") == "A100-40GB"


def test_requested_type_upsizes_to_the_smallest_type_that_holds_the_job() -> None:
    upper = np.full(len(GPU_NAMES), 100.0)  # no 80 GB card holds it
    assert requested_type(upper, 1) == "H200-141GB"
    assert requested_type(np.full(len(GPU_NAMES), 500.0), 1) == HABITUAL_GPU  # nothing does


def test_requested_type_wants_a_node_big_enough_for_the_gang() -> None:
    pool = Pool.from_dict(
        {
            "nodes": [
                {"name": "h", "gpu": "H100-80GB", "count": 2},
                {"name": "b", "gpu": "B200-180GB", "count": 8},
            ]
        }
    )
    assert requested_type(_upper(), 2, pool=pool) == "H100-80GB"
    assert requested_type(_upper(), 4, pool=pool) == "B200-180GB"
    assert requested_type(_upper(), 4) == "H100-80GB"  # without a pool, only memory counts


def test_the_specs_node_selector_reaches_the_request() -> None:
    from predictor.analytical import predict_table
    from scheduler.core.requests import requests_from_table

    sel = {"gpu-model": ["V100M32", "V100M16"]}
    specs = [
        parse_spec({"id": "s", "model": "qwen2.5-0.5b", "task": "inference", "node_selector": sel}),
        parse_spec({"id": "t", "model": "qwen2.5-0.5b", "task": "inference"}),
    ]
    table = predict_table(specs)
    want = (("gpu-model", ("V100M16", "V100M32")),)
    assert PlacementRequest.from_table(specs[0], table, 0).node_selector == want
    assert PlacementRequest.from_table(specs[1], table, 1).node_selector is None
    many = requests_from_table(
        specs,
        table,
        submit_time_s=[0.0, 0.0],
        requested_gpu=lambda upper: [HABITUAL_GPU] * len(upper),
        host_memory_floor_gib=[0.0, 0.0],
        sync=[
            r.sync for r in (PlacementRequest.from_table(s, table, i) for i, s in enumerate(specs))
        ],
    )
    assert [r.node_selector for r in many] == [want, None]


def test_requested_types_is_requested_type_on_every_row() -> None:
    from scheduler.core.requests import requested_types
    from scheduler.core.synthetic import synthetic_pool

    rng = np.random.default_rng(3)
    upper = rng.uniform(1.0, 250.0, (400, len(GPU_NAMES)))
    upper[rng.random(upper.shape) < 0.1] = np.inf
    upper[rng.random(upper.shape) < 0.05] = np.nan
    n_gpus = rng.choice([1, 2, 4, 8, 16], 400).tolist()
    wanted = [
        None if k == len(GPU_NAMES) else GPU_NAMES[k]
        for k in rng.integers(0, len(GPU_NAMES) + 1, 400)
    ]
    for pool in (None, synthetic_pool(64, 0)):
        got = requested_types(upper, n_gpus, wanted, pool)
        want = [
            requested_type(u, g, w, pool) for u, g, w in zip(upper, n_gpus, wanted, strict=True)
        ]
        assert got == want


def test_requests_from_table_equals_from_table() -> None:
    from predictor.analytical import predict_table
    from scheduler.core.requests import host_floor_gib, requested_types, requests_from_table
    from scheduler.sim.workload import generate_workload

    wl = generate_workload(0.2, 1, jobs_per_day=3000)
    specs = list(wl.specs)
    table = predict_table(specs)
    many = requests_from_table(
        specs,
        table,
        submit_time_s=wl.arrival_s.tolist(),
        requested_gpu=lambda upper: requested_types(
            upper, [s.n_gpus for s in specs], wl.requested_gpu
        ),
        host_memory_floor_gib=host_floor_gib(specs),
        sync=[PlacementRequest.from_table(s, table, i).sync for i, s in enumerate(specs)],
    )
    assert len(many) == len(specs) > 100
    for i, (spec, got) in enumerate(zip(specs, many, strict=True)):
        one = PlacementRequest.from_table(
            spec,
            table,
            i,
            submit_time_s=float(wl.arrival_s[i]),
            requested_gpu=requested_type(got.vram_upper_gib, spec.n_gpus, wl.requested_gpu[i]),
        )
        for name in PlacementRequest.__slots__:
            a, b = getattr(got, name), getattr(one, name)
            if isinstance(a, np.ndarray):
                assert np.array_equal(a, b, equal_nan=True), name
            else:
                assert a == b, name


def test_probe_request_equals_a_fresh_request() -> None:
    from scheduler.core.requests import probe_request

    r = PlacementRequest(
        "p",
        _upper(),
        _upper() * 1.1,
        np.full(len(GPU_NAMES), 30.0),
        np.full(len(GPU_NAMES), 45.0),
        n_gpus=4,
        tensor_parallel=2,
        gpu="H100-80GB",
        priority=3,
        deadline_s=99.0,
        submit_time_s=5.0,
        reserved_gib=12.0,
        busy_frac=np.linspace(0.2, 1.0, len(GPU_NAMES)),
        cpus=8.0,
        host_memory_gib=64.0,
        host_memory_floor_gib=20.0,
        node_selector={"gpu-model": ["V100M32"]},
    )
    v, t = _upper() * 0.9, np.full(len(GPU_NAMES), 33.0)
    got = probe_request(r, v, v, t, t)
    want = PlacementRequest(
        job_id=r.job_id,
        vram_gib=v,
        vram_upper_gib=v,
        runtime_s=t,
        runtime_upper_s=t,
        n_gpus=r.n_gpus,
        tensor_parallel=r.tensor_parallel,
        pipeline_parallel=r.pipeline_parallel,
        gpu=r.gpu,
        busy_frac=r.busy_frac,
        node_selector=r.node_selector,
    )
    for name in PlacementRequest.__slots__:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), name
        else:
            assert a == b, name
