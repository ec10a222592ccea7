"""A small pool of long-lived trace worker processes, each job under a time limit.

Imports of torch + transformers cost seconds, so workers live across jobs; a trace that runs
past its limit has its worker killed (the only reliable way to stop a Python computation) and
a fresh worker takes its place. Workers are spawned, not forked, so they never inherit a
parent's threads or Redis connections. Keep the pool small: each worker holds 0.35–0.5 GB.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any

from .exceptions import TraceError, TraceTimeout

__all__ = ["TracePool", "worker_main"]


def worker_main(conn: Any) -> None:
    """Child loop: receive a spec dict, send back ``("ok", summary)`` or ``("error", text)``."""
    import warnings

    warnings.filterwarnings("ignore")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    from ._run import trace_summary

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        try:
            conn.send(("ok", trace_summary(msg)))
        except Exception as exc:  # every failure becomes a recorded fallback, never a crash
            tb = traceback.format_exc(limit=3)
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:500] + "\n" + tb[-1500:]))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.proc: Any = None
        self.conn: Any = None

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent

    def run(self, spec_dict: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(spec_dict)
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TraceTimeout(f"trace ran past its {timeout_s:g} s limit; worker restarted")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.kill()
            raise TraceError("trace worker died (out of host memory or a crash)") from None
        if status != "ok":
            raise TraceError(str(payload))
        return dict(payload)

    def kill(self) -> None:
        if self.proc is not None and self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join(5)
        self.proc, self.conn = None, None

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.conn.send(None)
            self.proc.join(5)
        self.kill()


class TracePool:
    """``submit(spec_dict)`` → :class:`Future` of the trace summary dict.

    Each worker thread of the parent drives one worker process; results and errors come back
    through the futures. ``close()`` stops the workers (also on context exit).
    """

    def __init__(self, workers: int = 1, timeout_s: float = 120.0) -> None:
        if workers < 1:
            raise ValueError(f"`workers` must be at least 1; got {workers}")
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._q: queue.Queue[tuple[dict[str, Any], Future[dict[str, Any]]] | None] = queue.Queue()
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._threads = [
            threading.Thread(target=self._loop, args=(w,), daemon=True, name=f"trace-{i}")
            for i, w in enumerate(self._workers)
        ]
        for t in self._threads:
            t.start()

    def _loop(self, worker: _Worker) -> None:
        while True:
            item = self._q.get()
            if item is None:
                worker.close()
                return
            spec_dict, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            t0 = time.perf_counter()
            try:
                out = worker.run(spec_dict, self.timeout_s)
                out["wall_s"] = time.perf_counter() - t0
                fut.set_result(out)
            except BaseException as exc:
                fut.set_exception(exc)

    def submit(self, spec_dict: dict[str, Any]) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future()
        self._q.put((spec_dict, fut))
        return fut

    def close(self) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> TracePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
