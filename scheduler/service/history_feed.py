"""The leader's history tier: measured rows from ``P:history``, read incrementally, answering
recurring jobs at ingest.

Why the leader and not the client: the leader is one long-lived process that already reads
every pending record, so it can follow the history list with one ``LRANGE`` from where it
stopped, where every short-lived client (each ``snugfit submit``) would re-read the whole list.
The client stays a thin writer that predicts offline, and the record keeps the predictor's own
figures (``request``, ``predictions``), which the history's ratios and the simulated truth are
both taken against. Its state is nothing but the Redis list, so a restarted or new leader
rebuilds it by reading the list from the start.

Each worker row carries the predictor's figures for the slot it ran on (``hardware``:
``predicted_peak_gib``, ``predicted_runtime_s``, ``limit_gib``, ``exit_ok``). A finished run adds
measured / predicted ratios; an OOM adds a censored floor at its limit; a failed or cancelled
run adds nothing (its peak may not have been reached). Rows without the predictor's figures
(written by hand, older workers) cannot form a ratio and are skipped. Simulated rows count only
for a leader that runs simulated (``--simulated``), so a demo's rows never shape a real cluster.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from predictor.history import fingerprint_dict
from scheduler.core.history import RequestHistory, history_method
from scheduler.core.requests import PlacementRequest
from scheduler.service._intake import InvalidRecord
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import dumps

__all__ = ["HistoryFeed"]

log = logging.getLogger("snugfit.scheduler")


_ARRAYS = ("vram_gib", "vram_upper_gib", "runtime_s", "runtime_upper_s")


def _inf(xs: list[float | None]) -> np.ndarray:
    a = np.array([math.inf if x is None else float(x) for x in xs], dtype=np.float64)
    if a.shape != (len(GPU_NAMES),) or not (a >= 0).all():
        raise ValueError(f"need {len(GPU_NAMES)} values >= 0 or null")
    return a


def _pos(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and x > 0 else None


class HistoryFeed:
    """A :class:`RequestHistory` kept in step with the store's history list."""

    def __init__(self, store: Store, *, include_simulated: bool = False) -> None:
        self.store = store
        self.include_simulated = include_simulated
        self.history = RequestHistory()
        self.seen = 0  # rows of the list read so far
        self.skipped = 0
        # Rows that may train the learned tier (parsed, not simulated): the retrain trigger.
        self.real_rows = 0

    def poll(self, page: int = 10_000) -> int:
        """Read the rows appended since the last poll, ``page`` at a time (a restarted leader
        reads the whole list); returns how many were new."""
        n = 0
        while True:
            rows = self.store.history(self.seen, self.seen + page - 1)
            self.seen += len(rows)
            n += len(rows)
            for raw in rows:
                if not self._add(raw):
                    self.skipped += 1
            if len(rows) < page:
                return n

    def _add(self, raw: str) -> bool:
        try:
            row = json.loads(raw)
            spec, gpu = row["spec"], row["gpu"]
            hw = row.get("hardware") or {}
            if not isinstance(spec, dict) or not isinstance(gpu, str) or not isinstance(hw, dict):
                return False
        except (ValueError, KeyError, TypeError):
            return False
        if not row.get("simulated"):
            self.real_rows += 1
        if row.get("simulated") and not self.include_simulated:
            return False
        peak_pred, runtime_pred = (
            _pos(hw.get("predicted_peak_gib")),
            _pos(hw.get("predicted_runtime_s")),
        )
        if peak_pred is None:
            return False
        fp = fingerprint_dict(spec)
        if row.get("oom"):
            limit = _pos(hw.get("limit_gib")) or _pos(row.get("peak_vram_gib"))
            if limit is None:
                return False
            self.history.record_oom(fp, gpu, limit / peak_pred)
            return True
        if not hw.get("exit_ok", False):
            return False
        peak, runtime = _pos(row.get("peak_vram_gib")), _pos(row.get("runtime_s"))
        rt_ratio = runtime / runtime_pred if runtime and runtime_pred else None
        self.history.record_run(fp, gpu, None if peak is None else peak / peak_pred, rt_ratio)
        return True

    @property
    def reads_spec(self) -> bool:
        """Whether :meth:`answer` may read a first attempt's ``spec`` (only once a row is in:
        before that no fingerprint can match), so the leader reads specs only then."""
        return self.history.rows > 0

    def answer(
        self,
        jid: str,
        req: PlacementRequest,
        attempt: str | None,
        spec: str | None,
        stored: str | None,
    ) -> tuple[PlacementRequest, str | None]:
        """``req`` as history predicts it, and its method (None: not answered by history).

        History answers at the first ingest only, as the simulator does at arrival; later
        attempts reuse what it said then (``stored``, the record's ``history_request``) under
        their OOM floor. A new answer is written back to the record (``history_request``, and
        ``method`` when finished runs stand behind it)."""
        if stored:
            try:
                h = json.loads(stored)
                arrays = {k: _inf(h[k]) for k in _ARRAYS}
                n_runs = int(h["n_runs"])
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidRecord(f"malformed `history_request`: {exc}") from None
            new = replace(
                req,
                vram_gib=arrays["vram_gib"],
                vram_upper_gib=arrays["vram_upper_gib"],
                runtime_s=arrays["runtime_s"],
                runtime_upper_s=arrays["runtime_upper_s"],
            )
            return new, history_method(n_runs) if n_runs > 0 else None
        if int(attempt or 0) != 0 or not spec or self.history.rows == 0:
            # (No row read yet: no fingerprint can match, so the spec is not parsed.)
            return req, None
        try:
            fp = fingerprint_dict(json.loads(spec))
        except (ValueError, TypeError, AttributeError):
            return req, None
        got = self.history.apply(fp, req)
        if got is None:
            return req, None
        new, n_runs = got
        record: dict[str, Any] = {k: getattr(new, k).tolist() for k in _ARRAYS}
        record["n_runs"] = n_runs
        fields = {"history_request": dumps(record)}
        method = history_method(n_runs) if n_runs > 0 else None
        if method is not None:
            fields["method"] = method
        self.store.set_fields(jid, fields)
        return new, method
