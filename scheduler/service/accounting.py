"""Accounting as ``sacct`` reports it: what each job cost, in money and GPU-hours, what it
reserved and really used, and how the prediction compared, per job or summed by user or team
over a time window.

It is derived from the placement log (``P:events``), the one record of every attempt: each
``placed`` event names the option (GPU type, kind, GPUs, reservation, predicted VRAM, runtime
and cost); the attempt's end event (``finished``, ``oom``, ``cancelled`` or a user's
``requeued``, written by the worker) carries its measured outcome. An attempt is charged when
its end event falls in the window ``[since, until)``; attempts still running are charged when
they end, and attempts without a measured outcome (a lost lease) are not charged. Who ran it
(``user``, ``team``) comes from the job record.

Definitions, per attempt:

- ``cost_usd`` = the placement's predicted cost x measured runtime / predicted runtime: the
  option's price per second (price/hour x its share of the GPUs, as the scheduler priced it)
  for as long as the attempt held it;
- ``gpu_hours`` = GPUs held x measured hours, where a MIG slice counts as its share of the
  GPU's memory and an MPS share as its reservation's share of the GPU;
- ``reserved_gib`` / ``peak_vram_gib``: per GPU, what it held and what it used at its peak.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from scheduler.exceptions import ServiceError
from scheduler.service.store.protocol import Store

__all__ = [
    "END_EVENTS",
    "AcctGroup",
    "AcctJob",
    "Charge",
    "accounting",
    "charge_attempt",
    "charges",
    "gpu_share",
    "parse_when",
]

#: The events that end an attempt and carry its measured outcome.
END_EVENTS = ("finished", "oom", "cancelled", "requeued")
_REL = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PAGE = 10_000


def parse_when(text: str | float | None, now: float | None = None) -> float | None:
    """Epoch seconds of ``text``: an ISO 8601 time (naive = UTC), ``now``, epoch seconds, or a
    duration ago (``30m``, ``2h``, ``1d``, ``1w``); None for None."""
    if text is None:
        return None
    if isinstance(text, int | float):
        return float(text)
    t = time.time() if now is None else now
    s = text.strip()
    if s.lower() == "now":
        return t
    m = _REL.fullmatch(s)
    if m:
        return t - float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ServiceError(
            f"time {text!r} is not understood; give an ISO time (2026-12-01T09:00, "
            "2026-12-01T09:00:00Z), a duration ago (30m, 2h, 1d, 1w) or `now`"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass(frozen=True, slots=True)
class Charge:
    """One attempt that ran, as charged."""

    job_id: str
    attempt: int
    ended_at: float
    end: str  # the end event: finished / oom / cancelled / requeued
    gpu_type: str | None
    option: str | None
    n_gpus: int
    gpu_share: float  # GPUs held (a slice or a share as its fraction)
    reserved_gib: float | None
    predicted_vram_gib: float | None
    predicted_vram_upper_gib: float | None
    peak_vram_gib: float | None
    predicted_runtime_s: float | None
    runtime_s: float | None
    predicted_cost_usd: float | None
    cost_usd: float | None
    gpu_hours: float
    exit_code: int | None
    simulated: bool


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def gpu_share(opt: Mapping[str, Any]) -> float:
    """GPUs a placed option holds: its GPU count, a MIG slice's share of the GPU's memory, or
    a shared GPU's reserved share (also what the dashboard's usage chart charges)."""
    n = int(opt.get("n_gpus") or 1)
    kind = opt.get("kind")
    cap, res = _num(opt.get("capacity_gib")), _num(opt.get("reserved_gib"))
    if kind == "mig" and cap:
        from predictor.gpus import GPU_NAMES, get_gpu

        name = str(opt.get("gpu_type"))
        full = get_gpu(name).memory_gib if name in GPU_NAMES else None
        return min(1.0, cap / full) if full else 1.0
    if kind == "shared" and cap and res is not None:
        return min(1.0, res / cap)
    return float(n)


def charge_attempt(placed: Mapping[str, Any], end: Mapping[str, Any]) -> Charge:
    raw_opt, raw_out = placed.get("option"), end.get("outcome")
    opt: Mapping[str, Any] = raw_opt if isinstance(raw_opt, Mapping) else {}
    out: Mapping[str, Any] = raw_out if isinstance(raw_out, Mapping) else {}
    runtime = _num(out.get("runtime_s"))
    pred_rt = _num(opt.get("runtime_s"))
    pred_cost = _num(placed.get("cost_usd"))
    if pred_cost is None:
        pred_cost = _num(opt.get("cost_usd"))
    cost = None
    if pred_cost is not None and runtime is not None:
        cost = pred_cost * runtime / pred_rt if pred_rt else (0.0 if runtime == 0 else None)
    share = gpu_share(opt)
    return Charge(
        job_id=str(end.get("job_id")),
        attempt=int(end.get("attempt") or 0),
        ended_at=float(end.get("ts") or 0.0),
        end=str(end.get("event")),
        gpu_type=opt.get("gpu_type"),
        option=_label(opt),
        n_gpus=int(opt.get("n_gpus") or 1),
        gpu_share=share,
        reserved_gib=_num(opt.get("reserved_gib")),
        predicted_vram_gib=_num(opt.get("vram_gib")),
        predicted_vram_upper_gib=_num(opt.get("vram_upper_gib")),
        peak_vram_gib=_num(out.get("peak_vram_gib")),
        predicted_runtime_s=pred_rt,
        runtime_s=runtime,
        predicted_cost_usd=pred_cost,
        cost_usd=cost,
        gpu_hours=share * (runtime or 0.0) / 3600.0,
        exit_code=out.get("exit_code") if isinstance(out.get("exit_code"), int) else None,
        simulated=bool(out.get("simulated") or placed.get("simulated")),
    )


def _label(opt: Mapping[str, Any]) -> str | None:
    if not opt:
        return None
    if opt.get("kind") == "mig":
        return f"{opt.get('gpu_type')} MIG {opt.get('mig_profile')}"
    if opt.get("kind") == "shared":
        return f"{opt.get('gpu_type')} shared"
    return f"{opt.get('gpu_type')} x{opt.get('n_gpus')}"


def charges(
    store: Store, *, since: float | None = None, until: float | None = None
) -> list[Charge]:
    """Every attempt whose end event lies in ``[since, until)``, in log order."""
    placed: dict[tuple[str, int], dict[str, Any]] = {}
    out: list[Charge] = []
    after = "0"
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    while True:
        page = store.events(after, _PAGE)
        if not page:
            break
        after = page[-1][0]
        for _eid, e in page:
            kind = e.get("event")
            key = (str(e.get("job_id")), int(e.get("attempt") or 0))
            if kind == "placed":
                placed[key] = e
            elif kind in END_EVENTS and isinstance(e.get("outcome"), dict):
                p = placed.pop(key, None)
                ts = float(e.get("ts") or 0.0)
                if p is not None and lo <= ts < hi:
                    out.append(charge_attempt(p, e))
        if len(page) < _PAGE:
            break
    return out


@dataclass(slots=True)
class AcctJob:
    """One job's charged attempts in the window; predicted vs actual from its last one."""

    id: str
    user: str | None
    team: str | None
    state: str | None
    attempts: int
    option: str | None
    cost_usd: float
    gpu_hours: float
    reserved_gib: float | None
    predicted_vram_gib: float | None
    peak_vram_gib: float | None
    vram_ratio: float | None  # actual / predicted
    predicted_runtime_s: float | None  # the last attempt's, on its option
    runtime_s: float | None  # the last attempt's, measured
    runtime_ratio: float | None  # the last attempt's: actual / predicted
    runtime_total_s: float  # summed over the charged attempts (what cost and GPU-hours bill)
    ended_at: float
    simulated: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class AcctGroup:
    """Jobs summed by user or team (``key`` is ``-`` for jobs without one)."""

    key: str
    jobs: int = 0
    attempts: int = 0
    cost_usd: float = 0.0
    gpu_hours: float = 0.0
    reserved_gib_hours: float = 0.0  # reservation x hours held
    used_gib_hours: float = 0.0  # measured peak x hours
    runtime_s: float = 0.0
    predicted_runtime_s: float = 0.0
    ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ids")
        d["reserved_over_used"] = (
            self.reserved_gib_hours / self.used_gib_hours if self.used_gib_hours > 0 else None
        )
        return d


def _ratio(a: float | None, p: float | None) -> float | None:
    return a / p if a is not None and p else None


def accounting(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    by: str | None = None,
    users: Iterable[str] | None = None,
    teams: Iterable[str] | None = None,
    job_ids: Iterable[str] | None = None,
) -> dict[str, Any]:
    """``{"since", "until", "jobs": [AcctJob], "groups": [AcctGroup] (by user|team), "total":
    AcctGroup}`` over the charged attempts (see the module doc)."""
    if by not in (None, "user", "team"):
        raise ServiceError(f"--by {by!r}: group by `user` or `team`")
    cs = charges(store, since=since, until=until)
    ids = sorted({c.job_id for c in cs})
    recs = dict(zip(ids, store.get_fields(ids, ["user", "team", "state"]), strict=True))
    want_u, want_t = (set(x) if x is not None else None for x in (users, teams))
    want_j = set(job_ids) if job_ids is not None else None
    jobs: dict[str, AcctJob] = {}
    total = AcctGroup("total")
    groups: dict[str, AcctGroup] = {}
    for c in cs:
        user, team, state = recs.get(c.job_id, [None, None, None])
        if (want_u and user not in want_u) or (want_t and team not in want_t):
            continue
        if want_j is not None and c.job_id not in want_j:
            continue
        j = jobs.get(c.job_id)
        if j is None:
            j = jobs[c.job_id] = AcctJob(
                c.job_id, user, team, state, 0, None, 0.0, 0.0, None, None, None, None, None,
                None, None, 0.0, 0.0, False,
            )  # fmt: skip
        j.attempts += 1
        j.cost_usd += c.cost_usd or 0.0
        j.gpu_hours += c.gpu_hours
        j.runtime_s = c.runtime_s
        j.runtime_total_s += c.runtime_s or 0.0
        j.option, j.reserved_gib = c.option, c.reserved_gib
        j.predicted_vram_gib, j.peak_vram_gib = c.predicted_vram_gib, c.peak_vram_gib
        j.vram_ratio = _ratio(c.peak_vram_gib, c.predicted_vram_gib)
        j.predicted_runtime_s = c.predicted_runtime_s
        j.runtime_ratio = _ratio(c.runtime_s, c.predicted_runtime_s)
        j.ended_at = c.ended_at
        j.simulated = j.simulated or c.simulated
        key = (user if by == "user" else team) or "-"
        for g in (total, groups.setdefault(key, AcctGroup(key))) if by else (total,):
            _add(g, c)
    for g in (total, *groups.values()):
        g.jobs = len(set(g.ids))
    return {
        "since": since,
        "until": until,
        "by": by,
        "jobs": [jobs[k].to_dict() for k in sorted(jobs, key=lambda k: jobs[k].ended_at)],
        "groups": [groups[k].to_dict() for k in sorted(groups)],
        "total": total.to_dict(),
    }


def _add(g: AcctGroup, c: Charge) -> None:
    hours = (c.runtime_s or 0.0) / 3600.0
    g.ids.append(c.job_id)
    g.attempts += 1
    g.cost_usd += c.cost_usd or 0.0
    g.gpu_hours += c.gpu_hours
    g.reserved_gib_hours += (c.reserved_gib or 0.0) * c.n_gpus * hours
    g.used_gib_hours += (c.peak_vram_gib or 0.0) * c.n_gpus * hours
    g.runtime_s += c.runtime_s or 0.0
    g.predicted_runtime_s += c.predicted_runtime_s or 0.0
