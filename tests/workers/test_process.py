"""ProcessRun and its exec shim: the job's tree ends with its run, its stop and its worker."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.procs import wait_for
from workers.process import ProcessRun

# A job whose child escapes the process group (setsid) and ignores SIGTERM: only a subreaper
# that walks its tree, then SIGKILL, ends it.
SPAWN_GRANDCHILD = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    kid = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(15, signal.SIG_IGN); "
         "time.sleep(120)"],
        start_new_session=True,
    )
    with open(sys.argv[1] + ".tmp", "w") as fh:
        json.dump([os.getpid(), kid.pid], fh)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    if len(sys.argv) > 2:
        time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    """Running, not a zombie (a zombie is dead; only its exit status waits to be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def pids_from(path: Path) -> list[int]:
    wait_for(path.exists, 30, f"{path.name} to be written")
    return list(json.loads(path.read_text()))


def env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}


def test_what_a_finished_job_leaves_behind_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids.json"
    run = ProcessRun([sys.executable, "-c", SPAWN_GRANDCHILD, str(pidfile)], env(), None, [])
    run.grace_s = 0.5
    run.start()
    assert run.wait(30)
    res = run.result(80.0)
    assert res.exit_code == 0, res.output
    job, grandchild = pids_from(pidfile)
    assert not alive(job) and not alive(grandchild)


def test_stop_kills_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids.json"
    argv = [sys.executable, "-c", SPAWN_GRANDCHILD, str(pidfile), "stay"]
    run = ProcessRun(argv, env(), None, [], grace_s=0.5)
    run.start()
    job, grandchild = pids_from(pidfile)
    run.stop(0.5)
    res = run.result(80.0)
    assert res.signal == signal.SIGTERM and not res.oom
    assert not alive(job) and not alive(grandchild)


def test_a_command_that_cannot_start_raises_with_its_errno(tmp_path: Path) -> None:
    run = ProcessRun(["no-such-binary-snugfit"], env(), None, [])
    with pytest.raises(OSError) as got:
        run.start()
    assert got.value.errno == errno.ENOENT
    missing = ProcessRun(["/bin/true"], env(), None, [], workdir=str(tmp_path / "nope"))
    with pytest.raises(OSError, match="workdir"):
        missing.start()


def test_the_job_runs_in_its_workdir_with_only_its_environment(tmp_path: Path) -> None:
    code = "import json, os; print(json.dumps([os.getcwd(), dict(os.environ)]))"
    run = ProcessRun(
        [sys.executable, "-c", code], {"PATH": "/bin", "MINE": "1"}, None, [], workdir=str(tmp_path)
    )
    run.start()
    assert run.wait(30)
    res = run.result(80.0)
    cwd, seen = json.loads(res.output.strip().splitlines()[-1])
    assert cwd == str(tmp_path)
    seen.pop("LC_CTYPE", None)  # Python's own locale coercion under the C locale
    assert seen == {"PATH": "/bin", "MINE": "1"}


WORKER = textwrap.dedent(
    """
    import sys, time
    from workers.process import ProcessRun
    run = ProcessRun([sys.executable, "-c", sys.argv[1], sys.argv[2], "stay"], {"PATH": "/bin"},
                     None, [], grace_s=30)
    run.start()
    print("started", flush=True)
    time.sleep(120)
    """
)


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_the_death_of_the_worker_ends_the_whole_job(tmp_path: Path, kill: int) -> None:
    pidfile = tmp_path / "pids.json"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, SPAWN_GRANDCHILD, str(pidfile)],
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
        stdout=subprocess.PIPE,
    )
    try:
        job, grandchild = pids_from(pidfile)
        worker.send_signal(kill)
        worker.wait(10)
        t_kill = time.monotonic()
        wait_for(lambda: not alive(job) and not alive(grandchild), 2.0, "the job's processes")
        assert time.monotonic() - t_kill < 2.0
    finally:
        worker.kill()
        worker.wait()
