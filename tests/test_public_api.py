"""Each package names its public API in ``__all__``, and every name there resolves."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "package",
    [
        "predictor",
        "scheduler",
        "workers",
        # one sub-package per concern, each naming its own public API
        "scheduler.core",
        "scheduler.policies",
        "scheduler.sim",
        "scheduler.sim.openb",
        "scheduler.service",
        "scheduler.service.store",
        "scheduler.cli.demo",
        "workers.profile",
    ],
)
def test_every_public_name_resolves(package: str) -> None:
    mod = importlib.import_module(package)
    assert mod.__all__, f"{package}.__all__ is empty"
    missing = [name for name in mod.__all__ if getattr(mod, name, None) is None]
    assert not missing


def test_importing_the_scheduler_package_stays_light() -> None:
    # `snugfit predict` imports scheduler.cli; that must not drag in Redis, RQ or torch.
    code = "import sys, scheduler, scheduler.cli; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert not {"redis", "rq", "torch", "highspy"} & loaded


def test_python_dash_m_runs_the_cli() -> None:
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "--help"], capture_output=True, text=True
    )
    assert got.returncode == 0 and "Usage:" in got.stdout and "predict" in got.stdout
