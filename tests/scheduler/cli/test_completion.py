"""Shell completion (click's, documented in README): the scripts generate, and completing
works through the lazily loaded commands, down to shipped pool names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _complete(**env: str) -> str:
    got = subprocess.run(
        [sys.executable, "-c", "from scheduler.cli import main; main()"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    return got.stdout


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o nosort -F _snugfit_completion snugfit"),
     ("zsh", "#compdef snugfit"),
     ("fish", "complete --no-files --command snugfit")],
)  # fmt: skip
def test_completion_script_generates(shell: str, marker: str) -> None:
    script = _complete(_SNUGFIT_COMPLETE=f"{shell}_source")
    assert marker in script and "_SNUGFIT_COMPLETE" in script


def test_bash_completes_commands_and_shipped_pool_names() -> None:
    got = _complete(_SNUGFIT_COMPLETE="bash_complete", COMP_WORDS="snugfit ex", COMP_CWORD="1")
    assert got.split() == ["plain,explain"]
    words = "snugfit scheduler --pool "
    got = _complete(_SNUGFIT_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD="3")
    assert {"plain,mixed", "plain,small"} <= set(got.split())
    got = _complete(
        _SNUGFIT_COMPLETE="bash_complete", COMP_WORDS="snugfit logs --fo", COMP_CWORD="2"
    )
    assert "plain,--follow" in got.split()
