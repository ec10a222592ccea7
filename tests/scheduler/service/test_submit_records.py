"""build_records encodes each run of jobs that differ only in id once; every record is byte for
byte the record the job gets when it is built on its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from predictor.prediction import PredictionTable
from predictor.spec import JobSpec, parse_spec
from scheduler.service import _submit_records
from scheduler.service._submit_records import build_records
from tests.jobs import inference_spec

NOW = 1_800_000_000.25


def _table(n: int, *, rows: list[int] | None = None) -> PredictionTable:
    """n jobs on two GPU types; ``rows``: per job, which of three distinct rows it gets."""
    rows = [0] * n if rows is None else rows
    base = np.array([[10.0, 12.5], [11.0, np.nan], [-0.0, 1e-7]])[rows]
    return PredictionTable(
        job_ids=tuple(f"j{i}" for i in range(n)),
        gpu_names=("A100-80GB", "H100-80GB"),
        peak_vram_gib=base,
        peak_vram_upper_gib=base * 1.5,
        runtime_s=base + 60.0,
        runtime_upper_s=base + 90.0,
        breakdown_gib={"weights": base * 0.5, "overhead": base * 0.1},
        step_time_s=np.full_like(base, np.nan),
        ttft_s=base / 100,
        tpot_s=base / 1000,
        fits=base < 11.5,
        method=("analytical",) * n,
        busy_frac=np.full_like(base, 0.5),
    )


def _alone(specs: list[JobSpec], table: PredictionTable, **kw: Any) -> list[dict[str, str]]:
    """Each job's record built by itself (a one-job batch cannot share anything)."""
    out = []
    for i, s in enumerate(specs):
        one = table.take(np.array([i]), (table.job_ids[i],))
        out += build_records([s], one, now=NOW + i * 1e-6, **kw)
    return out


def _sweep(n: int, **kw: Any) -> list[JobSpec]:
    t = parse_spec(inference_spec(0, **kw))
    return [t.model_copy(update={"id": f"j{i}"}) for i in range(n)]


def test_a_sweep_gives_the_records_of_its_jobs_alone() -> None:
    specs, table = _sweep(50), _table(50)
    got = build_records(specs, table, now=NOW, hold=True, max_retries=5)
    want = _alone(specs, table, hold=True, max_retries=5)
    assert got == want
    assert [list(r) for r in got] == [list(r) for r in want]  # the fields in the same order


def test_runs_break_where_specs_rows_or_methods_change() -> None:
    a, b = _sweep(6), _sweep(6, priority=3, user="alice", depends_on=["p0"])
    specs = [a[0], a[1], b[2], b[3], a[4], a[5]]
    table = _table(6, rows=[0, 0, 0, 1, 1, 2])
    table = dataclasses.replace(table, method=("m1", "m1", "m1", "m1", "m2", "m2"))
    assert build_records(specs, table, now=NOW) == _alone(specs, table)
    # Equal values that are not the same objects: separate runs, the same records.
    fresh = [parse_spec(inference_spec(i)) for i in range(4)]
    assert build_records(fresh, _table(4), now=NOW) == _alone(fresh, _table(4))


def test_a_run_whose_text_holds_the_placeholder_is_encoded_job_by_job() -> None:
    # A spec cannot hold NUL through validation; model_copy does not validate.
    specs = [s.model_copy(update={"team": _submit_records._PLACEHOLDER}) for s in _sweep(4)]
    table = dataclasses.replace(_table(4), method=(_submit_records._PLACEHOLDER,) * 4)
    table = dataclasses.replace(table, job_ids=("j0", None, "j2", 'j"3'))
    got = build_records(specs, table, now=NOW)
    assert got == _alone(specs, table)
    assert '"id":null' in got[1]["predictions"]


def test_a_table_of_another_length_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 specs but a prediction table of 2 jobs"):
        build_records(_sweep(3), _table(2))


_ARRAY_FIELDS = [
    f.name
    for f in dataclasses.fields(PredictionTable)
    if isinstance(getattr(_table(1), f.name), np.ndarray | dict)
]


@pytest.mark.parametrize("field", _ARRAY_FIELDS)
def test_a_change_in_any_prediction_array_breaks_the_run(field: str) -> None:
    """Job 1 differs from job 0 in one array's row only (every array PredictionTable has,
    a breakdown component for the dict): its record is still its own."""
    specs, table = _sweep(2), _table(2)
    value = getattr(table, field)
    if isinstance(value, dict):
        value = {**value, "weights": value["weights"].copy()}
        value["weights"][1] += 1.0
    else:
        value = value.copy()
        value[1] = ~value[1] if value.dtype == bool else value[1] + 1.0
    table = dataclasses.replace(table, **{field: value})
    assert build_records(specs, table, now=NOW) == _alone(specs, table)
