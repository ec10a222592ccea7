"""The shipped data installs with the package: every file of datasets/ that git tracks is
matched by a `[tool.setuptools.data-files]` entry, and (slow) a non-editable install in a fresh
virtual environment finds it from another directory."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tracked_data() -> list[str]:
    got = subprocess.run(
        ["git", "ls-files", "datasets"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return [ln for ln in got.stdout.splitlines() if ln]


def test_every_tracked_dataset_file_is_installed() -> None:
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    tracked = _tracked_data()
    assert tracked, "git ls-files found no datasets/ files"
    missing = []
    for f in tracked:
        folder = "share/snugfit/" + str(Path(f).parent)
        patterns = files.get(folder, [])
        if not any(fnmatch.fnmatch(f, p) for p in patterns):
            missing.append(f)
    assert missing == [], f"add these to [tool.setuptools.data-files] in pyproject.toml: {missing}"


@pytest.mark.slow
def test_non_editable_install_finds_shipped_data_from_any_directory(tmp_path: Path) -> None:
    """pip install (a built wheel, no network: build and runtime dependencies come from this
    interpreter's environment) into a fresh venv, then run from an empty folder."""
    src = tmp_path / "src"
    src.mkdir()
    # The working tree's tracked files (what `pip install .` of a clean checkout would see).
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"], cwd=REPO, capture_output=True, check=True
    ).stdout
    archive = subprocess.run(
        ["tar", "-c", "--null", "-T", "-"], cwd=REPO, input=listed, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)],
        check=True,
        timeout=600,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies from this environment, after the venv's own site-packages (so the installed
    # snugfit, not this checkout's editable one, is what imports).
    (Path(site) / "deps.pth").write_text(here + "\n")
    wheel = next(dist.glob("snugfit-*.whl"))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    away = tmp_path / "away"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SNUGFIT_", "PYTHONPATH"))}
    env["SNUGFIT_HOME"] = str(tmp_path / "home")
    snugfit = str(venv / "bin" / "snugfit")

    def run(*args: str) -> str:
        got = subprocess.run(
            [snugfit, *args], cwd=away, env=env, capture_output=True, text=True, timeout=300
        )
        assert got.returncode == 0, got.stderr
        return got.stdout

    where = subprocess.run(
        [str(py), "-c", "import predictor, predictor._paths as p; print(predictor.__file__);"
         "print(p.datasets_dir())"],
        cwd=away, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert where[0].startswith(str(venv)) and where[1] == str(venv / "share/snugfit/datasets")
    for pool in ("mixed", "datasets/pools/mixed.toml"):
        out = run("simulate", "workload", "--pool", pool, "--days", "0.02", "--json")
        assert '"n_jobs"' in out
    assert "H200-141GB" in run("gpus", "--json")
    assert "llama-3.1-8b" in run("models", "--json")
