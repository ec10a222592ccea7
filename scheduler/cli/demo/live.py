"""The live run's outcome metrics, measured from its job records and placement log, with the
same keys as the simulator's (so ``summary.json`` compares like with like).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import Pool
from scheduler.exceptions import SchedulerError

__all__ = ["Attempt", "live_metrics", "read_attempts"]


@dataclass
class Attempt:
    job_id: str
    attempt: int
    option: dict[str, Any]
    start: float = math.nan
    end: float = math.nan
    peak_gib: float | None = None
    oom: bool = False
    state: str = ""


def read_attempts(events: Sequence[Mapping[str, Any]]) -> list[Attempt]:
    by_key: dict[tuple[str, int], Attempt] = {}
    order: list[tuple[str, int]] = []
    for e in events:
        jid, att = e.get("job_id"), e.get("attempt")
        if not isinstance(jid, str) or not isinstance(att, int):
            continue
        key = (jid, att)
        kind = e.get("event")
        if kind == "placed" and isinstance(e.get("option"), dict):
            by_key[key] = Attempt(jid, att, dict(e["option"]))
            order.append(key)
            continue
        a = by_key.get(key)
        if a is None:
            continue
        ts = float(e.get("ts") or math.nan)
        if kind == "started":
            a.start = ts
        elif kind in ("finished", "oom", "cancelled", "reclaimed") and math.isnan(a.end):
            a.end = ts
            out = e.get("outcome") if isinstance(e.get("outcome"), dict) else {}
            a.peak_gib = out.get("peak_vram_gib") if out else None
            a.oom = kind == "oom" or bool(out and out.get("oom"))
            a.state = str(out.get("state") or kind) if out else kind
    return [by_key[k] for k in order]


def live_metrics(
    records: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    pool: Pool,
    *,
    t0: float,
    time_scale: float,
) -> tuple[dict[str, Any], list[Attempt]]:
    """The simulator's metrics (:func:`scheduler.sim.outcomes.compute_metrics`) for a live run.

    Wall-clock times are mapped back to workload seconds (``/ time_scale``). Attempts come from
    the placement log (placed -> started -> finished/oom/reclaimed); cost is billed for the time
    each attempt held its slot at the option's price, OOM-killed attempts included.
    """
    from scheduler.core.decide import cheapest_index
    from scheduler.core.options import enumerate_options
    from scheduler.core.requests import PlacementRequest
    from scheduler.sim.outcomes import AttemptRecords, JobRecords, compute_metrics

    def w(ts: float | None) -> float:
        return math.nan if ts is None or not math.isfinite(ts) else (ts - t0) / time_scale

    attempts = read_attempts(events)
    by_job: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    rows = []
    for a in attempts:
        if math.isnan(a.start) or math.isnan(a.end):
            continue
        o = a.option
        dur = max(w(a.end) - w(a.start), 0.0)
        rt = o.get("runtime_s") or math.inf
        cost = float(o.get("cost_usd") or 0.0) * dur / rt
        price = pool.price_for(str(o.get("gpu_type")))
        n = int(o.get("n_gpus") or 1)
        cap = float(o.get("capacity_gib") or 0.0)
        peak = a.peak_gib if a.peak_gib is not None else cap
        rows.append((dur, cost, cost / price if price else 0.0, cap * n, min(peak, cap) * n))
    arr = np.asarray(rows, float).reshape(-1, 5)
    empty = pool.state()
    n = len(records)
    arrival = np.full(n, np.nan)
    first = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ooms = np.zeros(n, np.int64)
    rejected = np.zeros(n, bool)
    smallest = np.zeros(n, bool)
    reserved = np.full(n, np.nan)
    truth = np.full(n, np.nan)
    for i, rec in enumerate(records):
        jid = str(rec.get("id"))
        arrival[i] = w(rec.get("submitted_at"))
        rejected[i] = rec.get("state") == "rejected"
        mine = by_job.get(jid, [])
        starts = [a.start for a in mine if not math.isnan(a.start)]
        if starts:
            first[i] = w(min(starts))
        ooms[i] = sum(a.oom for a in mine)
        last = mine[-1] if mine else None
        if rec.get("state") != "succeeded" or last is None or last.peak_gib is None:
            continue
        end[i] = w(last.end)
        reserved[i] = float(last.option.get("reserved_gib") or math.nan)
        truth[i] = float(last.peak_gib)
        smallest[i] = _smallest_fit(rec, last, empty, enumerate_options, cheapest_index,
                                    PlacementRequest)  # fmt: skip
    jobs = JobRecords(arrival, first, end, ooms, rejected, smallest, reserved, truth)
    att = AttemptRecords(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4])
    m = compute_metrics(jobs, att, pool_gpus=pool.n_gpus, placement_seconds=0.0, n_placements=0)
    out = m.to_dict()
    out.pop("placements_per_s", None)
    out.update(_history_counts(records, ooms))
    return out, attempts


def _history_counts(records: Sequence[Mapping[str, Any]], ooms: np.ndarray) -> dict[str, int]:
    """The simulator's history keys, from each record's ``method`` (set by the leader)."""
    hist = np.array([str(r.get("method") or "").startswith("history:") for r in records], bool)
    return {
        "jobs_predicted_from_history": int(hist.sum()),
        "oom_kills_history": int(ooms[hist].sum()),
        "oom_kills_no_history": int(ooms[~hist].sum()),
    }


def _smallest_fit(
    rec: Mapping[str, Any],
    last: Attempt,
    empty: Any,
    enumerate_options: Callable[..., Any],
    cheapest_index: Callable[..., Any],
    request_cls: Any,
) -> bool:
    """Whether the job's final option is the cheapest one that holds its MEASURED peak (the
    simulator's definition, with the measurement standing in for the truth)."""
    req = rec.get("request")
    if not isinstance(req, Mapping):
        return False
    gpu = str(last.option.get("gpu_type"))
    pred = req.get("vram_gib") or []
    k = GPU_NAMES.index(gpu) if gpu in GPU_NAMES else -1
    if k < 0 or k >= len(pred) or not pred[k]:
        return False
    ratio = float(last.peak_gib or 0.0) / float(pred[k])
    vram = np.array([math.inf if v is None else float(v) * ratio for v in pred])
    runtime = np.array([math.inf if v is None else float(v) for v in req.get("runtime_s", [])])
    if runtime.shape != vram.shape:
        return False
    try:
        probe = request_cls(
            job_id=str(rec.get("id")),
            vram_gib=vram,
            vram_upper_gib=vram,
            runtime_s=runtime,
            runtime_upper_s=runtime,
            n_gpus=int(req.get("n_gpus", 1)),
            tensor_parallel=int(req.get("tensor_parallel", 1)),
            pipeline_parallel=int(req.get("pipeline_parallel", 1)),
            gpu=req.get("gpu"),
        )
        opts = enumerate_options(probe, empty)
    except SchedulerError:
        return False
    i = cheapest_index(opts, now=False)
    if i is None:
        return False
    best, got = opts[i], last.option
    return bool(
        best.gpu_type == got.get("gpu_type")
        and best.kind == got.get("kind")
        and best.mig_profile == got.get("mig_profile")
        and best.n_gpus == got.get("n_gpus")
    )
