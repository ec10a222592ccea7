"""The exec shim between a worker and its job: the job's process-group leader and subreaper.

Run as a script (``python -I -S _shim.py STATUS_FD WORKER_PID GRACE_S -- argv...``; standard
library only, so it starts in milliseconds and imports nothing from the job's environment):

- ``PR_SET_PDEATHSIG`` (SIGHUP) ties it to the worker: when the worker dies, even by SIGKILL,
  the kernel signals the shim, which kills every job process at once. A worker that died before
  the prctl took effect is caught by comparing ``getppid()`` with ``WORKER_PID``.
- ``PR_SET_CHILD_SUBREAPER`` keeps every descendant in its tree: a grandchild that calls
  ``setsid()`` or double-forks leaves the process group, but is re-parented to the shim, not to
  init, so it is still found and killed.
- SIGTERM (the worker's stop: cancel, lost lease, time limit) is forwarded to the job's group;
  after ``GRACE_S`` everything left gets SIGKILL. When the job's main process exits, whatever it
  left behind is killed too (like Slurm ending a step).
- ``STATUS_FD`` gets one line, ``ok PID`` or ``error ERRNO MESSAGE`` (the job could not be
  started), so the worker reports exec failures as before.

The shim exits with the job's own status (re-raising its signal), so the worker sees what the
job did. Only a SIGKILL of the shim itself escapes this; the worker's group kill then remains.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.02
_flags = {"term": False, "kill": False}


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _descendants() -> list[int]:
    """Every process below this one (the subreaper keeps orphans in the tree), from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parens): state, ppid, ...
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) > 1 and rest[0] != b"Z":
            children.setdefault(int(rest[1]), []).append(int(name))
    out: list[int] = []
    todo = [os.getpid()]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _signal_all(sig: int) -> None:
    # Process by process, not killpg: the shim is in the group and must outlive its job.
    for pid in _descendants():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(job_pid: int, status: list[int]) -> bool:
    """Reap every exited child; True while any child is left."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        if pid == job_pid:
            status.append(st)


def _kill_everything(job_pid: int, status: list[int]) -> None:
    deadline = time.monotonic() + 10.0
    while _reap(job_pid, status) and time.monotonic() < deadline:
        _signal_all(signal.SIGKILL)
        time.sleep(_POLL_S / 4)


def _on_term(signum: int, frame: object) -> None:
    _flags["term"] = True


def _on_hup(signum: int, frame: object) -> None:
    _flags["kill"] = True


def _exit_like(st: int) -> None:
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(st) if not os.WIFSIGNALED(st) else 128)


def main(argv: list[str]) -> None:
    status_fd, worker_pid, grace_s = int(argv[1]), int(argv[2]), float(argv[3])
    job_argv = argv[argv.index("--") + 1 :]
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, _on_hup)
    signal.signal(signal.SIGINT, _on_term)
    with os.fdopen(status_fd, "w") as status_out:
        try:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)
            if os.getppid() != worker_pid:
                raise OSError(0, "the worker exited before its job started")
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            job = subprocess.Popen(
                job_argv,
                stdin=subprocess.DEVNULL,
                # exec() resets the shim's handlers: the job starts with default signals.
            )
        except OSError as exc:
            status_out.write(f"error {exc.errno or 0} {exc.strerror or exc}\n")
            sys.exit(127)
        status_out.write(f"ok {job.pid}\n")
    status: list[int] = []
    term_deadline: float | None = None
    while _reap(job.pid, status):
        if _flags["kill"]:
            break
        if status:  # the job's main process is done: end what it left behind
            _signal_all(signal.SIGTERM)
            term_deadline = term_deadline or time.monotonic() + min(grace_s, 2.0)
        if _flags["term"] and term_deadline is None:
            _signal_all(signal.SIGTERM)
            term_deadline = time.monotonic() + grace_s
        if term_deadline is not None and time.monotonic() >= term_deadline:
            break
        time.sleep(_POLL_S)
    _kill_everything(job.pid, status)
    _exit_like(status[0] if status else 9)  # no status: killed before it could report


if __name__ == "__main__":
    main(sys.argv)
