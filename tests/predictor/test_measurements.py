import json
from typing import Any

import pytest

from predictor.exceptions import DataError
from predictor.measurements import (
    append_measurement,
    load_measurements,
    measurement_row,
    parse_measurement,
)

SPEC = {"model": "llama-3.1-8b", "task": "inference", "input_len": 128, "output_len": 16}


def _row(**kw):
    base: dict[str, Any] = dict(
        id="r1", origin="history", source="node-a job 1", spec=SPEC, gpu="H100-80GB"
    )
    base.update(kw)
    return measurement_row(**base, peak_vram_gib=kw.pop("peak_vram_gib", 17.0))


def test_row_round_trips_through_a_file(tmp_path):
    path = tmp_path / "h.jsonl"
    append_measurement(path, _row())
    append_measurement(path, _row(id="r2", gpu=None, gpu_model="A10G"))
    ms = load_measurements(path)
    assert [m.id for m in ms] == ["r1", "r2"]
    assert ms[0].spec.arch.name == "llama-3.1-8b"
    assert ms[0].value("peak_vram_gib") == 17.0
    assert parse_measurement(ms[0].to_row()) == ms[0]


def test_simulated_rows_are_excluded_by_default(tmp_path):
    path = tmp_path / "h.jsonl"
    append_measurement(path, _row(simulated=True))
    assert load_measurements(path) == []
    assert len(load_measurements(path, include_simulated=True)) == 1


def test_bad_row_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(_row())
    bad = json.dumps({**_row(id="x"), "gpu": "H100"})
    path.write_text(good + "\n" + bad + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*gpu"):
        load_measurements(path)
    with pytest.warns(UserWarning, match="bad.jsonl:2"):
        assert len(load_measurements(path, strict=False)) == 1


def test_row_must_measure_something_and_have_a_valid_spec():
    with pytest.raises(DataError, match="measures nothing"):
        measurement_row(id="x", origin="profile", source="s", spec=SPEC)
    with pytest.raises(DataError, match="JobSpec"):
        measurement_row(
            id="x", origin="profile", source="s", spec={**SPEC, "seq_len": 5}, tpot_s=0.01
        )


def test_duplicate_ids_are_rejected(tmp_path):
    path = tmp_path / "d.jsonl"
    append_measurement(path, _row())
    append_measurement(path, _row())
    with pytest.raises(DataError, match="duplicate id"):
        load_measurements(path)


def test_shipped_published_rows_load():
    ms = load_measurements()
    assert len(ms) > 300
    assert all(m.source for m in ms)
    assert sum(m.peak_vram_gib is not None for m in ms) >= 50


def test_quirk_and_low_confidence_rows_never_calibrate():
    from predictor.measurements import calibration_exclusion, load_measurements

    ms = {m.id: m for m in load_measurements()}
    # torchtune's generate row: its preallocated cache is in the spec now, no longer a quirk
    assert calibration_exclusion(ms["pub-vram-vp034"]) is None
    # lit-gpt's FSDP LoRA rows are modelled now (FSDP's no_sync gradients), no longer a quirk
    assert calibration_exclusion(ms["pub-vram-vp048"]) is None
    assert calibration_exclusion(ms["pub-vram-vp023"]) == "low confidence"
    # torchtune's 70B rows: below the checkpointed floor; paged states over the GPU's memory
    for row in ("pub-vram-vp024", "pub-vram-vp025"):
        assert calibration_exclusion(ms[row]) == "fails a data check (physics or sibling rows)"
    assert calibration_exclusion(ms["pub-vram-vp012"]) is None


def test_rows_from_lines_skip_bad_rows_and_simulated():
    import json

    import pytest

    from predictor.exceptions import DataError
    from predictor.measurements import measurements_from_lines

    good = {
        "id": "r1",
        "origin": "history",
        "source": "node a",
        "spec": {"model": "gpt2", "task": "inference"},
        "peak_vram_gib": 2.0,
    }
    sim = {**good, "id": "r2", "simulated": True}
    lines: list[str | bytes] = [json.dumps(good).encode(), json.dumps(sim), "not json"]
    with pytest.warns(UserWarning, match=r"redis\[3\]"):
        out = measurements_from_lines(lines, "redis", strict=False)
    assert [m.id for m in out] == ["r1"]
    with pytest.raises(DataError, match=r"redis\[3\]"):
        measurements_from_lines(lines, "redis")
