"""SweepParser validates a sweep once per shape and gives exactly what parse_spec gives:
the same specs, the same fields set, the same errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from annotated_types import MaxLen, MinLen

from predictor._spec_sweep import SweepParser
from predictor.exceptions import SpecError
from predictor.spec import JobSpec, parse_spec
from tests.jobs import TINY_LLAMA, inference_spec


def _same(a: JobSpec, b: JobSpec) -> None:
    assert a == b
    # As text: 64 == 64.0 and 0.0 == -0.0 in Python, but they are stored apart.
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    assert a.model_fields_set == b.model_fields_set
    assert type(a.id) is type(b.id)


def test_validators_the_cache_relies_on_are_pinned() -> None:
    # The cache reuses a validated spec for a new id because only the id field's own length
    # bounds and check_no_self_dependency (in _check_and_fill) read the id. A validator added
    # here must be checked for that in predictor/_spec_sweep.py before this list is updated.
    dec = JobSpec.__pydantic_decorators__
    assert not any("id" in v.info.fields for v in dec.field_validators.values())
    assert set(dec.model_validators) == {
        "_reject_unknown_and_strings",
        "_known_dtypes",
        "_check_and_fill",
    }
    assert JobSpec.model_fields["id"].metadata == [MinLen(1), MaxLen(200)]


SHAPES: list[dict[str, Any]] = [
    inference_spec(0),
    inference_spec(0, command=["python", "serve.py", "--port", "8000"], env={"A": "1"}),
    inference_spec(0, node_selector={"zone": ["a", "b"]}, cpus=4, host_memory_gib=32.0),
    {"id": "x", "model": TINY_LLAMA, "task": "inference", "batch_size": 1, "input_len": 16},
    {"id": "x", "model": "llama-3.1-8b", "task": "lora", "seq_len": 512, "lora_rank": 8},
    inference_spec(0, depends_on=["parent-a", "parent-b"], user="alice", team="ml"),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_sweep_parses_as_each_spec_alone(shape: dict[str, Any]) -> None:
    parser = SweepParser(fill={"user": "bob"})
    for i in range(5):
        raw = {**shape, "id": f"job-{i}"}
        got = parser.parse(raw)
        want = parse_spec(raw)
        if want.user is None:
            want = want.model_copy(update={"user": "bob"})
        _same(got, want)


def test_one_shape_is_validated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import predictor._spec_sweep as sweep

    calls: list[Any] = []

    def counted(raw: Any) -> JobSpec:
        calls.append(raw)
        return parse_spec(raw)

    monkeypatch.setattr(sweep, "parse_spec", counted)
    parser = SweepParser()
    specs = [parser.parse(inference_spec(i)) for i in range(100)]
    assert len(calls) == 1
    assert [s.id for s in specs] == [f"job-{i}" for i in range(100)]


@pytest.mark.parametrize(
    "bad",
    [
        {"id": ""},
        {"id": "x" * 201},
        {"id": 7},
        {"id": ["a"]},
        {"id": "parent-a"},  # lists itself in depends_on
        {"batch_size": 8.5},
        {"batch_size": -1},
        {"typo": 1},
    ],
)
def test_a_bad_spec_in_a_sweep_raises_what_it_raises_alone(bad: dict[str, Any]) -> None:
    base = inference_spec(0, depends_on=["parent-a"])
    parser = SweepParser()
    for i in range(3):
        parser.parse({**base, "id": f"ok-{i}"})
    raw = {**base, "id": "ok-bad", **bad}
    with pytest.raises(SpecError) as alone:
        parse_spec(raw)
    with pytest.raises(SpecError) as swept:
        parser.parse(raw)
    assert str(swept.value) == str(alone.value)
    _same(parser.parse({**base, "id": "ok-after"}), parse_spec({**base, "id": "ok-after"}))


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("batch_size", [8, 8.0, True, "8"]),
        ("lora_dropout", [0.0, -0.0]),
        ("model", [{**TINY_LLAMA, "hidden_size": 64}, {**TINY_LLAMA, "hidden_size": 64.0}]),
    ],
)
def test_equal_values_of_other_types_are_other_shapes(field: str, values: list[Any]) -> None:
    base = {"model": TINY_LLAMA, "task": "lora", "seq_len": 64, "lora_rank": 4}
    parser = SweepParser()
    for k, v in enumerate(values):
        raw = {**base, "id": f"j{k}", field: v}
        try:
            want = parse_spec(raw)
        except SpecError as exc:
            with pytest.raises(SpecError) as swept:
                parser.parse(raw)
            assert str(swept.value) == str(exc)
            continue
        _same(parser.parse(raw), want)


def test_specs_without_id_and_unkeyable_values_take_the_full_path() -> None:
    parser = SweepParser()
    raw = {k: v for k, v in inference_spec(0).items() if k != "id"}
    assert parser.parse(raw) is parser.parse(dict(raw))  # no id: the same validated spec
    _same(parser.parse({**raw, "id": None}), parse_spec({**raw, "id": None}))
    nan = {**inference_spec(1), "deadline_s": float("nan")}
    with pytest.raises(SpecError) as alone:
        parse_spec(nan)
    with pytest.raises(SpecError) as swept:
        parser.parse(nan)
    assert str(swept.value) == str(alone.value)
    _same(
        parser.parse({**inference_spec(2), "id": "é-2"}),
        parse_spec({**inference_spec(2), "id": "é-2"}),
    )


def test_fill_sets_only_unset_fields() -> None:
    parser = SweepParser(fill={"user": "bob"})
    assert parser.parse(inference_spec(0)).user == "bob"
    assert parser.parse(inference_spec(1, user="alice")).user == "alice"
    assert (
        parser.parse(inference_spec(2)).model_fields_set
        == parse_spec(inference_spec(2)).model_copy(update={"user": "bob"}).model_fields_set
    )
