"""Hostile and out-of-bounds specs: one set of bounds for JobSpec and the scheduler's request
record, capped reads, and messages that name the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.exceptions import SpecError
from predictor.limits import MAX_GPUS, MAX_PRIORITY, MAX_YAML_NODES
from predictor.spec import load_specs, parse_spec
from scheduler.service.store.records import RequestRecord

BASE = {"model": "llama-3.1-8b", "task": "inference", "input_len": 16, "output_len": 16}


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_gpus", 10**6), ("priority", 10**10), ("tensor_parallel", 5000), ("deadline_s", 1e300)],
)
def test_spec_and_request_record_share_bounds(field: str, value: float) -> None:
    with pytest.raises(SpecError, match=f"`{field}`"):
        parse_spec({**BASE, field: value})
    # The record refuses exactly what the spec refuses, so nothing passes one and fails later.
    rec = {k: [1.0] * 5 for k in ("vram_gib", "vram_upper_gib", "runtime_s", "runtime_upper_s")}
    with pytest.raises(ValueError):
        RequestRecord.model_validate({**rec, field: value})
    # n_gpus 4096 used to pass the client and then fail in the scheduler as "malformed record".
    for n in (4096, MAX_GPUS):
        RequestRecord.model_validate({**rec, "n_gpus": n, "priority": MAX_PRIORITY})
        parse_spec({**BASE, "n_gpus": n, "priority": MAX_PRIORITY})


def test_request_record_vram_must_be_positive_and_finite() -> None:
    rec = {k: [1.0] * 5 for k in ("vram_gib", "vram_upper_gib", "runtime_s", "runtime_upper_s")}
    for bad in ([0.0] * 5, [1e308] * 5):
        with pytest.raises(ValueError, match="VRAM values"):
            RequestRecord.model_validate({**rec, "vram_upper_gib": bad})


def test_model_not_a_string_names_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError, match=r"`model` must be a catalogue name.*got int 12.*Quote"):
        parse_spec({**BASE, "model": 12})


def test_command_with_non_strings_names_the_item() -> None:
    with pytest.raises(SpecError, match=r"`command` must be a list of strings.*item 0 is int 1"):
        parse_spec({**BASE, "command": [1, {"a": 2}]})
    with pytest.raises(SpecError, match=r"item 1 is dict"):
        parse_spec({**BASE, "command": ["python", {"a": 2}]})


def test_long_model_name_is_a_clear_error_not_oserror() -> None:
    with pytest.raises(SpecError, match=r"`model` is 1100 characters"):
        parse_spec({**BASE, "model": "m" * 1100})
    # Over the file system's 255-byte name limit but within the cap: an unknown model, no OSError.
    with pytest.raises(SpecError, match="unknown model"):
        parse_spec({**BASE, "model": "m" * 300})
    with pytest.raises(SpecError, match="unknown model"):
        parse_spec({**BASE, "model": "org/" + "m" * 300})


def test_client_submit_long_model_name_is_a_clear_error(redis_url: str) -> None:
    from scheduler.service.client import Client

    with pytest.raises(SpecError, match="unknown model"):
        Client(redis_url).submit({**BASE, "model": "x" * 300})


def test_yaml_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{prev}]")
    lines.append("model: llama-3.1-8b")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    assert f.stat().st_size < 1500  # ~9**10 nodes once expanded
    with pytest.raises(SpecError, match=f"more than {MAX_YAML_NODES:,} YAML nodes"):
        load_specs(f)


def test_deep_nesting_is_a_clear_error(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for name, text in (("deep.json", deep), ("deep.jsonl", deep), ("deep.yaml", "x: " + deep)):
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(SpecError, match="nested"):
            load_specs(f)
    model: dict[str, object] = {}
    cur = model
    for _ in range(100):
        cur["x"] = {}
        cur = cur["x"]  # type: ignore[assignment]
    with pytest.raises(SpecError, match="`model` is nested"):
        parse_spec({**BASE, "model": model})


def test_huge_config_json_is_refused_unread(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    with cfg.open("wb") as f:
        f.write(b'{"pad": "')
        f.seek(64 << 20)  # sparse: 64 MiB on paper, nothing on disk
        f.write(b'"}')
    with pytest.raises(SpecError, match="larger than 4 MiB"):
        parse_spec({**BASE, "model": str(cfg)})
    json.loads('{"ok": 1}')
