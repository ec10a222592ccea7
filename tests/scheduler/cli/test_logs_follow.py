"""`snugfit logs -f` on a real Redis, with the real scheduler service and a real worker running
a real command: it waits for a job that has not started, prints output as the worker publishes
it, ends with the job (exit status by its final state), and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from scheduler.cli._follow import TailDiff
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.jobs import one_waiting_for_capacity
from tests.workers.test_worker import drain, make_worker

REPO = Path(__file__).resolve().parents[3]
POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})
_WAIT_S = 60.0


class _Lines:
    """Lines of a child's pipe, read on a thread so the test can wait on them with a timeout."""

    def __init__(self, pipe: IO[str]) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.q.put(line)
        self.q.put(None)

    def wait_for(self, needle: str, timeout: float = _WAIT_S) -> str:
        for seen in self.seen:
            if needle in seen:
                return seen
        while True:
            line = self.q.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"pipe closed before {needle!r}; saw {self.seen}")
            self.seen.append(line)
            if needle in line:
                return line

    def rest(self, timeout: float = _WAIT_S) -> list[str]:
        while True:
            line = self.q.get(timeout=timeout)
            if line is None:
                return self.seen
            self.seen.append(line)


def _follow(url: str, home: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SNUGFIT_REDIS_URL=url, SNUGFIT_HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", "from scheduler.cli import main; main()", "logs", "-f", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_follow_waits_for_a_pending_job_then_prints_its_output_until_it_succeeds(
    store: RedisStore, redis_url: str, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    code = (
        "import pathlib, time\n"
        "print('first line', flush=True)\n"
        "end = time.time() + 60\n"  # never hang the test if the gate is never opened
        f"while not pathlib.Path({str(gate)!r}).exists() and time.time() < end: "
        "time.sleep(0.02)\n"
        "print('second line', flush=True)\n"
    )
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", code]))
    proc = _follow(redis_url, tmp_path / "home", h.id)
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)  # type: ignore[arg-type]
    try:
        assert "Reason=" in err.wait_for(f"==> job {h.id} is pending")  # not started yet
        SchedulerService(store, POOL).step()
        seen_running: list[str] = []

        def release_when_first_line_shows() -> None:
            # The job blocks on the gate: its first line must reach `logs -f` while it runs.
            out.wait_for("first line")
            seen_running.append(h.status())
            gate.write_text("")

        opener = threading.Thread(target=release_when_first_line_shows)
        opener.start()
        # RQ's worker installs signal handlers, so it runs on the main thread.
        drain(make_worker(store, tmp_path, simulate=False, nvml=None))
        opener.join(timeout=_WAIT_S)
        assert seen_running == ["running"]
        assert proc.wait(timeout=_WAIT_S) == 0
        lines = out.rest()
        assert [ln.strip() for ln in lines] == ["first line", "second line"]  # each once
        end = err.wait_for(f"==> job {h.id} ended succeeded")
        assert "(attempt 1)" in end
        assert "Traceback" not in "".join(err.rest())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_follow_json_of_a_failed_job_ends_with_its_state_and_exit_status_1(
    store: RedisStore, redis_url: str, tmp_path: Path
) -> None:
    code = "import sys; print('boom', flush=True); sys.exit(3)"
    h = Client(store=store).submit(spec(1, [sys.executable, "-c", code]))
    SchedulerService(store, POOL).step()
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert h.status() == "failed"
    proc = _follow(redis_url, tmp_path / "home", h.id, "--json")
    stdout, _ = proc.communicate(timeout=_WAIT_S)
    assert proc.returncode == 1
    rows = [json.loads(ln) for ln in stdout.splitlines()]
    assert [r["kind"] for r in rows] == ["output", "end"]  # it had ended: no state line
    assert rows[0]["text"].strip() == "boom" and rows[0]["attempt"] == 1
    assert rows[1]["state"] == "failed" and "exit code 3" in rows[1]["reason"]
    assert all(isinstance(r["ts"], float) for r in rows)


def test_ctrl_c_stops_following_cleanly(store: RedisStore, redis_url: str, tmp_path: Path) -> None:
    h = Client(store=store).submit(spec(2))  # no scheduler: it stays pending
    proc = _follow(redis_url, tmp_path / "home", h.id)
    err = _Lines(proc.stderr)  # type: ignore[arg-type]
    try:
        err.wait_for(f"==> job {h.id} is pending")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=_WAIT_S) == 130
        assert "Traceback" not in "".join(err.rest()) and "Aborted" not in "".join(err.seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_logs_of_an_unknown_job_is_an_error(redis_url: str, tmp_path: Path) -> None:
    proc = _follow(redis_url, tmp_path / "home", "nope")
    _, stderr = proc.communicate(timeout=_WAIT_S)
    assert proc.returncode == 1 and "no job with id 'nope'" in stderr


def test_tail_diff_prints_only_new_text_as_the_capped_window_slides() -> None:
    d = TailDiff(anchor_chars=2)
    assert d.update("a\nb\n") == "a\nb\n"
    assert d.update("a\nb\nc\n") == "c\n"
    assert d.update("a\nb\nc\n") == ""
    assert d.update("b\nc\nd\n") == "d\n" and not d.skipped  # the window slid by one line
    assert d.update("x\ny\n") == "x\ny\n" and d.skipped  # more than the cap between two reads
    d.reset()
    assert d.update("attempt 2\n") == "attempt 2\n" and not d.skipped


class _Seen(Exception):
    pass


def test_follow_words_a_capacity_wait_by_the_options_priced_now(store: RedisStore) -> None:
    """The leader keeps a pending job's decision in memory only; `logs -f` prices its options
    read-only (as `explain` does) instead of saying the scheduler has not considered it."""
    from scheduler.cli._follow import _describe, follow_job

    waiting = one_waiting_for_capacity(store)
    lines: list[str] = []

    def emit(chunk: object) -> None:
        lines.append(str(getattr(chunk, "reason", "")))
        raise _Seen

    with pytest.raises(_Seen):  # stop at the first state line
        follow_job(store, waiting, emit, describe=lambda f: _describe(store, waiting, f))
    assert lines and "Reason=Resources" in lines[0]
    assert "insufficient free H100-80GB" in lines[0] and "not yet considered" not in lines[0]


def test_follow_keeps_the_stored_reason_of_a_held_job(store: RedisStore) -> None:
    from scheduler.cli._follow import _describe

    held = {"state": "pending", "attempt": "", "decision": "", "reason": "JobHeldUser: held"}
    assert _describe(store, "nobody", held) == "JobHeldUser: held"
