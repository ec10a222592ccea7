"""An engine job that cannot be told its reservation is reserved the engine's default share of
a whole GPU, so it never lands on a smaller slice or share."""

from __future__ import annotations

import pytest
import redis

from predictor.gpus import GPU_NAMES, get_gpu
from scheduler.core.engines import ENGINE_DEFAULT_FRACTION, can_be_told, engine_upper_gib
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec

POOL = Pool.from_dict(
    {
        "name": "mixed",
        "nodes": [
            {"name": "mig", "gpu": "A100-80GB", "count": 1, "mode": "mig", "mig": "dynamic"},
            {"name": "sh", "gpu": "H100-80GB", "count": 1, "mode": "shared"},
            {"name": "whole", "gpu": "H200-141GB", "count": 1},
        ],
    }
)


def test_untold_engine_floor_is_the_default_fraction_of_each_type() -> None:
    upper = [10.0] * len(GPU_NAMES)
    got = engine_upper_gib("vllm", ["vllm", "serve", "m"], None, upper)
    assert got == [max(10.0, 0.9 * get_gpu(n).memory_gib) for n in GPU_NAMES]
    told = engine_upper_gib(
        "vllm", ["vllm", "--gpu-memory-utilization={gpu_memory_utilization}"], None, upper
    )
    assert told == upper
    assert engine_upper_gib("vllm", None, None, upper) == upper  # simulated: no engine
    assert engine_upper_gib("hf", ["python", "x.py"], None, upper) == upper
    assert can_be_told(["sh"], {"X": "{mem_fraction_static}"})
    assert set(ENGINE_DEFAULT_FRACTION) == {"vllm", "sglang", "trtllm"}


@pytest.mark.parametrize("framework", ["vllm", "sglang", "trtllm"])
def test_untold_engine_never_gets_a_slice_or_a_small_share(redis_url: str, framework: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    client = Client(store=store)
    untold = client.submit(spec("u", ["serve", "--model", "m"], framework=framework))
    SchedulerService(store, POOL).step()
    p = untold.placement
    assert p is not None, untold.reason
    floor = ENGINE_DEFAULT_FRACTION[framework] * get_gpu(p.gpu_type).memory_gib
    assert p.reserved_gib >= floor - 1e-6
    # Only a slot as big as the engine's default share holds it (a 7g slice is the whole GPU).
    assert p.capacity_gib >= floor - 1e-6
    assert p.kind != "mig" or p.mig_profile == "7g.80gb"


def test_a_told_engine_may_take_a_slice(redis_url: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    told = Client(store=store).submit(
        spec(
            "t", ["serve", "--gpu-memory-utilization", "{gpu_memory_utilization}"], framework="vllm"
        )
    )
    SchedulerService(store, POOL).step()
    p = told.placement
    assert p is not None and p.reserved_gib < 0.9 * get_gpu(p.gpu_type).memory_gib
