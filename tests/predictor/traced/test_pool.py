"""Traces in real worker processes: a cache hit after a trace, and a trace timeout."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.spec import parse_spec
from predictor.traced import TraceCache, TracedPredictor, fingerprint, trace_specs, wait_for_traces
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


def _submitted_method(client: Any, spec: dict[str, Any]) -> str:
    """The ``method`` of the prediction stored with the submitted job (one per GPU type)."""
    methods = {p.method for p in client.submit(spec).prediction.values()}
    assert len(methods) == 1, methods
    return methods.pop()


def test_submit_waits_for_the_trace_within_its_budget(
    tmp_path: Any, redis_url: str, monkeypatch: Any
) -> None:
    """A first submit of a shape waits for its trace and is placed on the traced peak; with
    a budget too short the job is predicted analytically and its trace still lands in the
    cache, so the next submit of that shape answers from it at once."""
    from scheduler.service.client import Client

    monkeypatch.setenv("SNUGFIT_HOME", str(tmp_path))  # an empty trace cache
    job = {"model": TINY, "task": "lora", "batch_size": 1, "seq_len": 8}
    waited = Client(redis_url, trace_budget_s=300)
    assert _submitted_method(waited, {**job, "id": "a"}).startswith("traced")

    other = {**job, "seq_len": 16}
    hurried = Client(redis_url, trace_budget_s=0.001)
    assert _submitted_method(hurried, {**other, "id": "b"}).startswith("analytical")
    # The submit left the shape's trace running; waiting for it again joins that trace.
    (again,) = wait_for_traces([parse_spec(other)], budget_s=300)
    assert again.status in ("cached", "ok"), again.reason
    assert TraceCache().get(fingerprint(parse_spec(other))) is not None
    assert _submitted_method(hurried, {**other, "id": "c"}).startswith("traced")
