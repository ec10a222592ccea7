"""The traced tier's fallbacks, cache and predictor contract (no torch needed here)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from predictor import analytical
from predictor.spec import parse_spec
from predictor.traced import (
    TraceCache,
    TracedPredictor,
    fingerprint,
    trace_specs,
    unsupported_reason,
)
from tests.jobs import TINY_LLAMA

TINY = TINY_LLAMA


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        ({"task": "inference", "framework": "vllm"}, "vllm"),
        ({"task": "inference", "framework": "sglang"}, "sglang"),
        ({"task": "inference", "framework": "trtllm"}, "trtllm"),
        ({"task": "full_finetune", "compile": True}, "torch.compile"),
        ({"task": "full_finetune", "framework": "deepspeed"}, "DeepSpeed"),
        ({"task": "pretrain", "framework": "megatron", "compute_dtype": "fp8"}, "Megatron"),
        ({"task": "full_finetune", "compute_dtype": "fp8"}, "fp8"),
    ],
)
def test_excluded_frameworks_fall_back_to_analytical(
    extra: dict[str, Any], word: str, tmp_path: Any
) -> None:
    spec = parse_spec({"model": TINY, **extra})
    why = unsupported_reason(spec)
    assert why is not None and word in why
    (out,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert out.status == "unsupported" and not out.traced
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec], ["H100-80GB"])
    a = analytical.predict_table([spec], ["H100-80GB"])
    assert t.method == ("analytical",)
    assert np.allclose(t.peak_vram_gib, a.peak_vram_gib)


def test_unbuildable_family_is_unsupported() -> None:
    spec = parse_spec({"model": "deepseek-v3", "task": "inference"})
    assert "MLA" in (unsupported_reason(spec) or "")


def test_fingerprint_ignores_identity_but_not_shapes() -> None:
    a = parse_spec({"model": TINY, "task": "lora", "id": "a", "steps": 10})
    b = parse_spec({"model": TINY, "task": "lora", "id": "b", "steps": 99, "priority": 3})
    c = parse_spec({"model": TINY, "task": "lora", "seq_len": 4096})
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


def test_cached_summary_answers_with_traced_method(tmp_path: Any) -> None:
    spec = parse_spec({"model": TINY, "task": "full_finetune", "id": "j"})
    cache = TraceCache(tmp_path)
    summary = {
        "allocated_gib": 10.0,
        "reserved_gib": 11.0,
        "breakdown_gib": {
            "weights": 2.0,
            "gradients": 2.0,
            "optimizer": 4.0,
            "activations": 1.5,
            "kv_cache": 0.0,
            "logits": 0.5,
        },
    }
    cache.put(fingerprint(spec), {"status": "ok", "summary": summary})
    # A fresh cache object reads the file: what `snugfit predict` does after `snugfit trace`.
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec], ["A100-80GB"])
    assert t.method == ("traced",)
    ovh = t.breakdown_gib["overhead"][0, 0]
    assert ovh == pytest.approx(1.0 + 0.45)  # reserved − allocated + CUDA context
    assert t.peak_vram_gib[0, 0] == pytest.approx(10.0 + ovh)
    assert sum(v[0, 0] for v in t.breakdown_gib.values()) == pytest.approx(t.peak_vram_gib[0, 0])
    (out,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert out.status == "cached"
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["status"] == "ok"


def test_failed_trace_is_recorded_and_answered_analytically(tmp_path: Any) -> None:
    spec = parse_spec({"model": TINY, "task": "full_finetune"})
    cache = TraceCache(tmp_path)
    cache.put(fingerprint(spec), {"status": "failed", "reason": "boom", "summary": None})
    (out,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert (out.status, out.reason) == ("failed", "boom")
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec])
    assert set(t.method) == {"analytical"}


def test_wait_for_trace_answers_a_cache_hit_or_an_excluded_job_at_once(tmp_path: Any) -> None:
    from predictor.traced import wait_for_trace

    spec = parse_spec({"model": TINY, "task": "full_finetune"})
    cache = TraceCache(tmp_path)
    cache.put(fingerprint(spec), {"status": "ok", "summary": {"allocated_gib": 1.0}})
    assert wait_for_trace(spec, budget_s=0.0, cache=cache).status == "cached"
    vllm = parse_spec({"model": TINY, "task": "inference", "framework": "vllm"})
    assert wait_for_trace(vllm, budget_s=0.0, cache=cache).status == "unsupported"


def test_without_torch_the_tier_reports_itself_unavailable(tmp_path: Any, monkeypatch: Any) -> None:
    import predictor.traced._api as api

    monkeypatch.setattr(api, "is_available", lambda: False)
    spec = parse_spec({"model": TINY, "task": "full_finetune"})
    (out,) = trace_specs([spec], cache=TraceCache(tmp_path))
    assert out.status == "unavailable" and "snugfit[trace]" in out.reason
    t = TracedPredictor(cache=TraceCache(tmp_path)).predict_table([spec])
    assert set(t.method) == {"analytical"}


def test_wait_for_traces_answers_what_needs_no_trace_at_once_in_order(tmp_path: Any) -> None:
    from predictor.traced import wait_for_traces

    cache = TraceCache(tmp_path)
    hit = parse_spec({"model": TINY, "task": "full_finetune", "id": "hit"})
    cache.put(fingerprint(hit), {"status": "ok", "summary": {"allocated_gib": 1.0}})
    same = parse_spec({"model": TINY, "task": "full_finetune", "id": "same-shape"})
    vllm = parse_spec({"model": TINY, "task": "inference", "framework": "vllm", "id": "v"})
    out = wait_for_traces([hit, vllm, same], budget_s=0.0, cache=cache)
    assert [(o.id, o.status) for o in out] == [
        ("hit", "cached"),
        ("v", "unsupported"),
        ("same-shape", "cached"),
    ]


def test_client_trace_budget_defaults_and_refusals(monkeypatch: Any) -> None:
    from predictor.traced import SUBMIT_BUDGET_S
    from scheduler.exceptions import ServiceError
    from scheduler.service.client import TRACE_BUDGET_ENV, _trace_budget

    monkeypatch.delenv(TRACE_BUDGET_ENV, raising=False)
    assert _trace_budget(None) == SUBMIT_BUDGET_S == 15.0
    assert _trace_budget(2.5) == 2.5
    monkeypatch.setenv(TRACE_BUDGET_ENV, "0")
    assert _trace_budget(None) == 0.0
    assert _trace_budget(4) == 4.0  # an explicit budget wins over the variable
    monkeypatch.setenv(TRACE_BUDGET_ENV, "soon")
    with pytest.raises(ServiceError, match=r"\$SNUGFIT_TRACE_BUDGET_S.*'soon'"):
        _trace_budget(None)
    with pytest.raises(ServiceError, match=r"`trace_budget_s` must be .*-1"):
        _trace_budget(-1)
