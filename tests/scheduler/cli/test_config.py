"""snugfit.toml and paths: flag > env > ./snugfit.toml > $SNUGFIT_HOME/snugfit.toml > default,
errors that name the file and the key, and shipped data found from any working directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from predictor._paths import datasets_dir
from scheduler.cli import cli

_SIM = ["simulate", "workload", "--days", "0.02", "--policy", "rightsize", "--json"]


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside the checkout, and a private $SNUGFIT_HOME."""
    cwd = tmp_path / "cwd"
    home = tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SNUGFIT_HOME", str(home))
    monkeypatch.delenv("SNUGFIT_CONFIG", raising=False)
    monkeypatch.delenv("SNUGFIT_REDIS_URL", raising=False)
    return tmp_path


def _run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def _sim(*extra: str) -> dict[str, Any]:
    got = _run([*_SIM, *extra])
    assert got.exit_code == 0, got.output
    return json.loads(got.output)  # type: ignore[no-any-return]


def test_shipped_pools_resolve_from_any_directory(elsewhere: Path) -> None:
    shipped = datasets_dir() / "pools" / "mixed.toml"
    for given in ("mixed", "mixed.toml", "datasets/pools/mixed.toml", str(shipped)):
        assert Path(_sim("--pool", given)["pool"]).resolve() == shipped.resolve(), given
    assert not (Path.cwd() / "datasets").exists()  # truly not from the working directory
    got = _run([*_SIM, "--pool", "nope"])
    assert got.exit_code == 2 and "shipped: mixed, small" in got.output


def test_a_local_file_wins_over_a_shipped_name(elsewhere: Path) -> None:
    (Path.cwd() / "mixed").write_text((datasets_dir() / "pools" / "small.toml").read_text())
    assert _sim("--pool", "mixed")["pool"] == "mixed"  # the file here, as given


def test_config_precedence_flag_then_cwd_file_then_home_file_then_default(
    elsewhere: Path,
) -> None:
    assert _sim()["seed"] == 0  # built-in default
    home_cfg = elsewhere / "home" / "snugfit.toml"
    home_cfg.write_text('pool = "small"\n[simulate.workload]\nseed = 5\nfeedback = false\n')
    got = _sim()
    assert got["seed"] == 5 and got["feedback"] is False and got["pool"].endswith("small.toml")
    (Path.cwd() / "snugfit.toml").write_text("[simulate.workload]\nseed = 7\n")
    got = _sim()
    assert got["seed"] == 7 and got["feedback"] is False  # merged key by key: cwd over home
    assert _sim("--seed", "9")["seed"] == 9  # the flag wins over both
    only = elsewhere / "only.toml"
    only.write_text("[simulate.workload]\nseed = 11\n")
    got = json.loads(_run(["--config", str(only), *_SIM]).output)
    assert got["seed"] == 11 and got["feedback"] is True and got["pool"].endswith("mixed.toml")
    got = json.loads(_run(_SIM, env={"SNUGFIT_CONFIG": str(only)}).output)
    assert got["seed"] == 11
    got = json.loads(_run(_SIM, env={"SNUGFIT_CONFIG": "none"}).output)
    assert got["seed"] == 0  # no file at all (what the demo gives its child processes)


def test_environment_wins_over_the_file_and_the_flag_over_both(
    elsewhere: Path, redis_url: str
) -> None:
    dead = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    cfg = Path.cwd() / "snugfit.toml"
    cfg.write_text(f'redis = "{redis_url}"\n')
    assert _run(["status", "--json"]).exit_code == 0  # the file's URL is used
    got = _run(["status", "--json"], env={"SNUGFIT_REDIS_URL": dead})
    assert got.exit_code == 1 and "127.0.0.1:1" in got.output  # the env's URL beat the file's
    cfg.write_text(f'redis = "{dead}"\n')
    got = _run(["status", "--json", "--redis", redis_url], env={"SNUGFIT_REDIS_URL": dead})
    assert got.exit_code == 0, got.output  # the flag beat both
    assert json.loads(got.output)["counts"]["pending"] == 0


def test_relative_paths_in_a_file_are_relative_to_that_file(elsewhere: Path) -> None:
    pools = elsewhere / "home" / "pools"
    pools.mkdir()
    (pools / "lab.toml").write_text((datasets_dir() / "pools" / "small.toml").read_text())
    (elsewhere / "home" / "snugfit.toml").write_text('pool = "pools/lab.toml"\n')
    assert Path(_sim()["pool"]) == pools / "lab.toml"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('polcy = "rightsize"\n', ["unknown top-level key `polcy`", "[command] table"]),
        ('policy = "fastest"\n', ["key `policy` = 'fastest'", "rightsize"]),
        ('redis = "http://x"\n', ["key `redis` = 'http://x'", "redis://"]),
        ("[schedulr]\nx = 1\n", ["table [schedulr] is not a snugfit command", "scheduler"]),
        ("[simulate.workload]\ndayz = 1\n", ["key `dayz` is not an option", "days"]),
        ('[simulate.workload]\ndays = "soon"\n', ["key `days` in [simulate.workload]", "soon"]),
        ('pool = "nowhere"\n', ["key `pool` = 'nowhere'", "shipped: mixed, small"]),
        ("pool = [\n", ["not a readable TOML file"]),
    ],
)
def test_config_errors_name_the_file_and_the_key(
    elsewhere: Path, text: str, needles: list[str]
) -> None:
    cfg = Path.cwd() / "snugfit.toml"
    cfg.write_text(text)
    got = _run(_SIM)
    assert got.exit_code == 1
    assert str(cfg) in got.output
    for n in needles:
        assert n in got.output, got.output


def test_datasets_key_points_the_process_at_a_data_folder(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.delenv("SNUGFIT_DATASETS", raising=False)
    copy = elsewhere / "data"
    shutil.copytree(datasets_dir(), copy)
    (copy / "pools" / "tiny.toml").write_text(
        'name = "tiny"\n[[nodes]]\nname = "n1"\ngpu = "H100-80GB"\ncount = 1\n'
    )
    (Path.cwd() / "snugfit.toml").write_text('datasets = "../data"\n')
    got = _run([*_SIM[:-1], "--pool", "tiny"])
    assert got.exit_code == 0, got.output
    assert "pool tiny" in got.output
    bad = Path.cwd() / "snugfit.toml"
    bad.write_text('datasets = "/nonexistent"\n')
    got = _run(_SIM)
    assert got.exit_code == 1 and "key `datasets`" in got.output
