"""Serving engines are told the memory they were reserved: argv/env templating for vLLM,
SGLang and TensorRT-LLM, and the fractions behind it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from workers.engines import engine_values, fill_placeholders
from workers.worker import NodeWorker

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1}]})
# Prints its argv and the SNUGFIT_* engine variables, like an engine's launcher would read them.
ECHO = (
    "import json, os, sys; print('OUT=' + json.dumps([sys.argv[1:], "
    "{k: v for k, v in os.environ.items() if k.startswith(('SNUGFIT_', 'FRAC'))}]))"
)
BREAKDOWN = {"weights": 15.0, "activations": 1.0, "logits": 0.5, "overhead": 0.5, "kv_cache": 3.0}


def test_fractions_follow_each_engines_definition() -> None:
    v = engine_values(20.0, 80.0, BREAKDOWN)
    assert v["gpu_memory_utilization"] == "0.2500"  # vLLM: reservation / capacity
    assert v["mem_fraction_static"] == "0.2250"  # SGLang: (20 - 2 dynamic) / 80
    # TRT-LLM: KV budget (20 - 17 non-KV) / what is left after them (80 - 17).
    assert v["kv_cache_free_gpu_memory_fraction"] == f"{int(3 / 63 * 10_000) / 10_000:.4f}"
    # Rounded down and kept inside (0, 1): an engine is never told more than it was reserved.
    assert engine_values(80.0, 80.0, None)["gpu_memory_utilization"] == "0.9900"
    assert float(engine_values(12.34567, 80.0, None)["gpu_memory_utilization"]) <= 12.34567 / 80


def test_only_the_placeholders_are_replaced() -> None:
    values = {"gpu_memory_utilization": "0.5"}
    assert fill_placeholders('{"a": 1} {gpu_memory_utilization}', values) == '{"a": 1} 0.5'


@pytest.mark.parametrize(
    ("framework", "argv", "key"),
    [
        (
            "vllm",
            ["--gpu-memory-utilization", "{gpu_memory_utilization}"],
            "gpu_memory_utilization",
        ),
        ("sglang", ["--mem-fraction-static={mem_fraction_static}"], "mem_fraction_static"),
        (
            "trtllm",
            ["--kv_cache_free_gpu_memory_fraction", "{kv_cache_free_gpu_memory_fraction}"],
            "kv_cache_free_gpu_memory_fraction",
        ),
    ],
)
def test_the_engine_is_told_through_its_command_and_environment(
    store: RedisStore, tmp_path: Path, framework: str, argv: list[str], key: str
) -> None:
    job = spec(0, [sys.executable, "-c", ECHO, *argv], framework=framework)
    job["env"] = {"FRAC": "{" + key + "}"}
    h = Client(store=store).submit(job)
    SchedulerService(store, POOL).step()
    p = h.placement
    assert p is not None
    NodeWorker(store, "n1", pool=POOL, nvml=None, heartbeat_s=0.05).work(burst=True)
    assert h.status() == "succeeded", h.reason
    seen_argv, env = json.loads(next(x for x in h.logs().splitlines() if x.startswith("OUT="))[4:])
    breakdown = json.loads(h.record()["predictions"])[p.gpu_type]["breakdown_gib"]
    want = engine_values(p.reserved_gib, p.capacity_gib, breakdown)[key]
    assert want in " ".join(seen_argv) and "{" not in " ".join(seen_argv)
    assert env["FRAC"] == want and env[f"SNUGFIT_{key.upper()}"] == want
    assert env["SNUGFIT_RESERVED_GIB"] == f"{p.reserved_gib:.3f}"


def test_a_replica_is_told_its_plans_values_too(store: RedisStore, tmp_path: Path) -> None:
    # A serving replica's placement carries its plan's engine values (issue 15); they fill the
    # command's placeholders beside the memory fractions, and are exported as SNUGFIT_*.
    argv = [
        "--max-num-seqs",
        "{max_num_seqs}",
        "--gpu-memory-utilization",
        "{gpu_memory_utilization}",
    ]
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", ECHO, *argv], framework="vllm"))
    SchedulerService(store, POOL).step()
    p = h.placement
    assert p is not None
    p.engine = {"max_num_seqs": "48", "gpu_memory_utilization": "0.8800"}
    store.set_fields("job-0", {"placement": p.model_dump_json()})
    NodeWorker(store, "n1", pool=POOL, nvml=None, heartbeat_s=0.05).work(burst=True)
    assert h.status() == "succeeded", h.reason
    seen_argv, env = json.loads(next(x for x in h.logs().splitlines() if x.startswith("OUT="))[4:])
    assert seen_argv == ["--max-num-seqs", "48", "--gpu-memory-utilization", "0.8800"]
    assert env["SNUGFIT_MAX_NUM_SEQS"] == "48"
