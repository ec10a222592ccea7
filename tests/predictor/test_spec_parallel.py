"""``max_tensor_parallel``: the spec's permission for an OOM retry to raise tensor parallelism."""

from __future__ import annotations

from typing import Any

import pytest

from predictor.exceptions import SpecError
from predictor.history import fingerprint
from predictor.spec import parse_spec, tensor_parallel_steps

_INFER = {"model": "llama-3.1-70b", "task": "inference", "batch_size": 1}
_LORA = {"model": "llama-3.1-8b", "task": "lora", "seq_len": 1024}


@pytest.mark.parametrize("base", [_INFER, _LORA])
def test_inference_and_training_jobs_take_it(base: dict[str, Any]) -> None:
    s = parse_spec(base | {"max_tensor_parallel": 8})
    assert s.max_tensor_parallel == 8
    assert parse_spec(s.to_dict()) == s  # round-trips
    assert parse_spec(base).max_tensor_parallel is None  # optional: no re-split by default


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"max_tensor_parallel": 0}, "`max_tensor_parallel`"),
        ({"max_tensor_parallel": 4096}, "`max_tensor_parallel`"),
        ({"max_tensor_parallel": "four"}, "`max_tensor_parallel`"),
        (
            {"tensor_parallel": 4, "n_gpus": 4, "max_tensor_parallel": 2},
            "`max_tensor_parallel` 2 is below `tensor_parallel` 4; set it to at least 4",
        ),
        (
            {"tensor_parallel": 2, "n_gpus": 2, "max_tensor_parallel": 3},
            "`max_tensor_parallel` 3 permits no retry degree: an OOM retry doubles "
            "`tensor_parallel` 2 to 4 (with `n_gpus` 4",
        ),
        (
            {"n_gpus": 65536, "max_tensor_parallel": 2},
            "set it to 2 or more, or to 1 to never re-split",
        ),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_fix(
    extra: dict[str, Any], needle: str
) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(_INFER | extra)
    assert needle in str(exc.value)


def test_equal_to_tensor_parallel_means_never_re_split() -> None:
    s = parse_spec(_INFER | {"tensor_parallel": 2, "n_gpus": 2, "max_tensor_parallel": 2})
    assert tensor_parallel_steps(s.tensor_parallel, s.n_gpus, s.max_tensor_parallel) == []


def test_serve_deployments_are_refused_with_the_reason() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(
            {
                "model": "llama-3.1-8b",
                "task": "serve",
                "request_rate": 2.0,
                "max_tensor_parallel": 4,
            }
        )
    assert "does not apply to `serve` deployments" in str(exc.value)
    assert "snugfit plan" in str(exc.value)


def test_steps_double_up_to_the_bound() -> None:
    assert tensor_parallel_steps(1, 1, 8) == [2, 4, 8]
    assert tensor_parallel_steps(1, 1, 6) == [2, 4]
    assert tensor_parallel_steps(2, 4, 8) == [4, 8]  # data parallel 2 is kept: n_gpus 8, 16
    assert tensor_parallel_steps(1, 1, None) == []
    assert tensor_parallel_steps(1, 30000, 4) == [2]  # n_gpus 120,000 would pass MAX_GPUS


def test_the_permission_is_not_part_of_the_jobs_identity() -> None:
    # A run at TP=1 is the same recurring job with or without permission to re-split it; a
    # run at TP=2 is not (its per-GPU memory differs).
    plain = parse_spec(_INFER)
    allowed = parse_spec(_INFER | {"max_tensor_parallel": 2})
    split = parse_spec(_INFER | {"max_tensor_parallel": 2, "tensor_parallel": 2, "n_gpus": 2})
    assert fingerprint(plain) == fingerprint(allowed) != fingerprint(split)
