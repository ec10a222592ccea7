"""JobSpec's workflow and identity fields (user, team, depends_on) and job arrays."""

from __future__ import annotations

from typing import Any

import pytest

from predictor.exceptions import SpecError
from predictor.spec import expand_array, parse_array, parse_spec

BASE: dict[str, Any] = {"id": "a", "model": "llama-3.1-8b", "task": "inference"}


def test_new_fields_are_optional_and_round_trip() -> None:
    plain = parse_spec(BASE)
    assert plain.user is None and plain.team is None and plain.depends_on is None
    assert "depends_on" not in plain.to_dict()
    s = parse_spec({**BASE, "user": "alice", "team": "ml-infra", "depends_on": ["p-1", "p-2"]})
    assert s.depends_on == ("p-1", "p-2")
    assert parse_spec(s.to_dict()) == s
    assert s.to_dict()["depends_on"] == ["p-1", "p-2"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"depends_on": "p-1"}, "not a string; got 'p-1'. Write it as depends_on: [\"p-1\"]"),
        ({"depends_on": ["a"]}, "lists the job's own id 'a'"),
        ({"depends_on": ["p", "p"]}, "`depends_on[1]` lists 'p' twice"),
        ({"depends_on": ["p q"]}, "`depends_on[0]` 'p q' contains whitespace"),
        ({"depends_on": [""]}, "`depends_on[0]` is 0 characters"),
        ({"depends_on": [3]}, "`depends_on[0]` must be a job id string; got int 3"),
        ({"depends_on": [f"p{i}" for i in range(1001)]}, "at most 1000"),
        ({"user": "al ice"}, "`user` 'al ice' is not a valid name"),
        ({"team": 7}, "`team` must be a string; got int 7"),
        ({"user": "x" * 65}, "`user`"),
    ],
)  # fmt: skip
def test_bad_workflow_fields_name_field_value_and_fix(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({**BASE, **extra})
    assert message in str(exc.value)


def test_a_serve_deployment_takes_no_depends_on() -> None:
    serve = {"id": "s", "model": "llama-3.1-8b", "task": "serve", "request_rate": 2.0,
             "depends_on": ["p"]}  # fmt: skip
    with pytest.raises(SpecError, match="`depends_on` does not apply to `serve` jobs"):
        parse_spec(serve)


def test_parse_array_takes_slurm_ranges_steps_and_lists() -> None:
    assert parse_array("0-99") == list(range(100))
    assert parse_array("0-9:2") == [0, 2, 4, 6, 8]
    assert parse_array("1,3,5") == [1, 3, 5]
    assert parse_array("0-2,10,20-30:5,1") == [0, 1, 2, 10, 20, 25, 30]
    bad_arrays = [("a", "is not an index"), ("5-2", "ends before it starts; use 2-5"),
                  ("0-3:0", "step"), ("", "give indices"), ("0-200000", "more than")]  # fmt: skip
    for bad, msg in bad_arrays:
        with pytest.raises(SpecError, match=msg):
            parse_array(bad)


def test_expand_array_substitutes_the_index_and_suffixes_plain_ids() -> None:
    cmd = ["run", "--shard", "{index}", "{gpu_memory_utilization}"]
    spec = {**BASE, "id": "train", "command": cmd, "env": {"SHARD": "{index}"},
            "depends_on": ["prep-{index}"]}  # fmt: skip
    els = expand_array(spec, [3, 4], chain=True)
    assert [e["id"] for e in els] == ["train-3", "train-4"]
    assert els[0]["command"] == ["run", "--shard", "3", "{gpu_memory_utilization}"]
    assert els[1]["env"] == {"SHARD": "4"}
    assert els[0]["depends_on"] == ["prep-3"]
    assert els[1]["depends_on"] == ["prep-4", "train-3"]
    placed = expand_array({**BASE, "id": "sweep-{index}-x"}, [7])
    assert placed[0]["id"] == "sweep-7-x"
    anon = expand_array({k: v for k, v in BASE.items() if k != "id"}, [0, 1])
    assert anon[0]["id"].endswith("-0") and anon[1]["id"].endswith("-1")
    assert anon[0]["id"][:-2] == anon[1]["id"][:-2]
    for e in els:
        parse_spec(e)
