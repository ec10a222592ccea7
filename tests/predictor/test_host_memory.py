"""The host memory estimate (predictor.host_memory) and the spec's host-resource fields."""

from __future__ import annotations

from typing import Any

import pytest

from predictor._memory import MemoryModel
from predictor.exceptions import SpecError
from predictor.host_memory import HostMemoryModel, _offload_bytes_per_rank, host_memory_gib
from predictor.models import resolve_model
from predictor.spec import parse_spec

GIB = 1024**3


def _spec(**kw: Any) -> Any:
    return parse_spec({"model": "llama-3.1-8b", "task": "inference", **kw})


def _weights_gib(model: str, bytes_per_param: float) -> float:
    return resolve_model(model).total_params() * bytes_per_param / GIB


def test_loading_stages_each_ranks_shard_in_its_checkpoint_dtype() -> None:
    base = HostMemoryModel().process_gib
    one, tp4, nf4, int4 = host_memory_gib(
        [
            _spec(),
            _spec(model="llama-3.1-70b", n_gpus=4, tensor_parallel=4),
            parse_spec({"model": "llama-3.1-8b", "task": "qlora"}),
            _spec(weight_dtype="int4"),
        ]
    )
    assert one == pytest.approx(base + _weights_gib("llama-3.1-8b", 2.0))
    # Four ranks each stage a quarter of the 70B model: the whole model once, plus 4 baselines.
    assert tp4 == pytest.approx(4 * base + _weights_gib("llama-3.1-70b", 2.0))
    # bitsandbytes nf4 quantises on load from the 16-bit checkpoint.
    assert nf4 == pytest.approx(one)
    # A GPTQ/AWQ checkpoint is stored quantised (embeddings stay 16-bit): far less to stage.
    assert base < int4 < base + 0.5 * (one - base)


def test_data_parallel_replicas_each_load_but_zero3_loads_once_per_node() -> None:
    base = HostMemoryModel().process_gib
    w = _weights_gib("llama-3.1-8b", 2.0)
    dp, z3 = host_memory_gib(
        [
            parse_spec({"model": "llama-3.1-8b", "task": "full_finetune", "n_gpus": 4}),
            parse_spec(
                {"model": "llama-3.1-8b", "task": "full_finetune", "n_gpus": 4, "zero_stage": 3}
            ),
        ]
    )
    assert dp == pytest.approx(4 * (base + w))
    assert z3 == pytest.approx(4 * base + w)


def test_cpu_offload_needs_host_memory_while_running() -> None:
    train = {"model": "llama-3.1-8b", "task": "full_finetune", "batch_size": 8, "seq_len": 4096}
    plain, offload = host_memory_gib(
        [parse_spec(train), parse_spec({**train, "activation_offload": True})]
    )
    paged_free = {"model": "llama-3.1-8b", "task": "full_finetune", "optimizer": "adamw_8bit"}
    # Saved activations of 32 layers x 32k tokens wait in pinned host buffers: far more than
    # the 15 GiB of weights loading stages.
    assert offload > plain + 50
    # Paged 8-bit AdamW keeps its states (2 bytes per parameter) in unified memory that
    # pages out to the host: all of them, worst case. Loading the 16-bit weights stages as
    # much, so here the running figure ties the loading one.
    paged = parse_spec(
        {"model": "llama-3.1-8b", "task": "full_finetune", "optimizer": "paged_adamw_8bit"}
    )
    params = resolve_model("llama-3.1-8b").total_params()
    assert _offload_bytes_per_rank([paged], MemoryModel())[0] == pytest.approx(2 * params)
    assert _offload_bytes_per_rank([parse_spec(paged_free)], MemoryModel())[0] == 0


def test_estimate_is_vectorised_and_empty_input_is_empty() -> None:
    assert host_memory_gib([]).shape == (0,)
    specs = [_spec(batch_size=b) for b in (1, 2, 4)]
    assert host_memory_gib(specs).tolist() == [host_memory_gib([s])[0] for s in specs]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("cpus", 0, "`cpus` must be between 0.001 and 4096"),
        ("cpus", 5000, "got 5000"),
        ("cpus", "many", "`cpus` must be a number; got 'many'"),
        ("cpus", True, "`cpus` must be a number; got bool"),
        ("cpus", float("nan"), "`cpus` must be finite"),
        ("host_memory_gib", -2, "`host_memory_gib` must be > 0"),
        ("host_memory_gib", 1e6, "at most 65536 GiB; got 1000000.0"),
    ],
)
def test_spec_host_fields_are_validated_with_field_value_and_fix(
    field: str, value: object, needle: str
) -> None:
    with pytest.raises(SpecError) as exc:
        _spec(**{field: value})
    assert needle in str(exc.value)
    assert "Omit it" in str(exc.value) or "Write e.g." in str(exc.value)


def test_spec_host_fields_round_trip() -> None:
    s = _spec(cpus=0.5, host_memory_gib=64)
    assert (s.cpus, s.host_memory_gib) == (0.5, 64.0)
    assert parse_spec(s.to_dict()) == s
    assert "cpus" not in _spec().to_dict()
