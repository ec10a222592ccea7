import json

from scheduler.cli.train import read_redis_history
from scheduler.service.store.keys import Keys


def test_train_reads_the_history_list_from_redis(redis_url, redis_client):
    row = {
        "id": "h1",
        "origin": "history",
        "source": "node a",
        "spec": {"model": "gpt2", "task": "inference"},
        "gpu": "A100-80GB",
        "peak_vram_gib": 2.0,
        "measurement": "nvml_used",
    }
    key = Keys("t").history
    redis_client.rpush(key, json.dumps(row), json.dumps({**row, "id": "h2", "simulated": True}))
    got = read_redis_history(redis_url, "t")
    assert [m.id for m in got] == ["h1"]
    assert read_redis_history(redis_url, "other") == []


def test_train_writes_to_snugfit_home_and_keeps_the_previous_artifact(tmp_path, monkeypatch):
    from predictor.artifact import default_artifact_path
    from scheduler.cli.train import _output_path

    monkeypatch.setenv("SNUGFIT_HOME", str(tmp_path))
    first = _output_path(None, False)
    assert first == tmp_path / "artifacts" / "learned.json"
    first.write_text("old")
    again = _output_path(None, False)
    assert again == first and not first.exists()
    assert (tmp_path / "artifacts" / "learned.previous.json").read_text() == "old"
    # The shipped artifact changes only when asked for by name.
    assert _output_path(None, True) == default_artifact_path()


def test_train_output_and_overwrite_shipped_exclude_each_other(tmp_path):
    from click.testing import CliRunner

    from scheduler.cli.train import train_command

    got = CliRunner().invoke(
        train_command, ["--output", str(tmp_path / "x.json"), "--overwrite-shipped"]
    )
    assert got.exit_code != 0 and "exclude each other" in got.output
