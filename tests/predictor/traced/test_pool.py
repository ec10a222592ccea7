"""Traces in real worker processes: a cache hit after a trace, and a trace timeout."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.spec import parse_spec
from predictor.traced import TraceCache, TracedPredictor, trace_specs
from tests.jobs import TINY_LLAMA

pytestmark = pytest.mark.torch

TINY = TINY_LLAMA


def test_trace_then_cache_hit(tmp_path: Any) -> None:
    spec = parse_spec({"model": TINY, "task": "lora", "batch_size": 1, "seq_len": 8, "id": "x"})
    (first,) = trace_specs([spec], cache=TraceCache(tmp_path), timeout_s=300)
    assert first.status == "ok", first.reason
    assert first.summary is not None and first.summary["allocated_gib"] > 0
    (again,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert again.status == "cached" and again.summary == first.summary
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec], ["H100-80GB"])
    assert t.method == ("traced",)


def test_trace_past_its_limit_is_killed_and_recorded(tmp_path: Any) -> None:
    spec = parse_spec({"model": TINY, "task": "full_finetune", "batch_size": 1, "seq_len": 8})
    (out,) = trace_specs([spec], cache=TraceCache(tmp_path), timeout_s=0.05)
    assert out.status == "timeout" and "limit" in out.reason
    (again,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert again.status == "timeout"  # recorded, so the job is answered analytically
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec])
    assert set(t.method) == {"analytical"}
