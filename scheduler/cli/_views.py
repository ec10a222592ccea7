"""The typed JSON documents the service commands print (``status ID``, ``explain``, ``cancel``,
``logs``, ``node``), as pydantic models: numbers are numbers, times are Unix epoch seconds
(floats, as everywhere in the service), absent values are ``null``.

A job record in Redis is a hash of strings (:mod:`scheduler.service.store.keys`);
:func:`job_view` decodes it once, validates the nested placement and outcome by their own
records (one that does not match is shown as stored and named in ``invalid``), spells the
compact decision out, and keeps a field it cannot decode as ``null``, named in ``unreadable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from scheduler.service.store.records import OutcomeRecord, PlacementRecord

__all__ = ["CancelView", "JobView", "LogChunk", "LogsView", "NodeView", "job_view"]


class JobView(BaseModel):
    """One job record. Fields this version does not know (added by a newer writer) pass
    through unchanged, as the strings Redis holds."""

    model_config = ConfigDict(extra="allow")

    id: str
    state: str | None = None
    spec: dict[str, Any] | None = None
    request: dict[str, Any] | None = None
    predictions: dict[str, Any] | None = None
    method: str | None = None
    history_request: dict[str, Any] | None = None
    submitted_at: float | None = None
    updated_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int | None = None
    max_retries: int | None = None
    lost: int | None = None
    moved: int | None = None
    ooms: int | None = None
    max_oom_retries: int | None = None
    reserved_gib: float | None = None
    decision: dict[str, Any] | None = None
    placement: PlacementRecord | dict[str, Any] | None = None
    worker: str | None = None
    outcome: OutcomeRecord | dict[str, Any] | None = None
    reason: str | None = None
    cancel_requested: bool = False
    simulated: bool = False
    deployment: str | None = None
    engine: dict[str, Any] | None = None
    #: fields that could not be decoded at all (shown as ``null``)
    unreadable: list[str] = []
    #: fields that decode but do not match their record's schema (shown as stored)
    invalid: list[str] = []


def job_view(raw: Mapping[str, str]) -> JobView:
    """Decode a job hash (as :meth:`Store.get_job` returns it) into a :class:`JobView`."""
    from scheduler.cli.ops import parse_record
    from scheduler.core.decision import Decision
    from scheduler.exceptions import SchedulerError

    rec = parse_record(raw)
    bad = list(rec.pop("_unreadable", []))
    invalid = []
    for name, model in (("placement", PlacementRecord), ("outcome", OutcomeRecord)):
        value = rec.get(name)
        if value is None:
            continue
        try:
            rec[name] = model.model_validate(value)
        except ValidationError:
            invalid.append(name)
    decision = rec.get("decision")
    if isinstance(decision, dict) and "option_columns" in decision:
        try:
            rec["decision"] = Decision.from_dict(decision).to_dict()
        except (SchedulerError, KeyError, TypeError, ValueError):
            rec["decision"] = None
            bad.append("decision")
    for name in ("spec", "request", "predictions", "history_request", "engine", "decision"):
        if name in rec and not isinstance(rec[name], dict | type(None)):
            rec[name] = None
            bad.append(name)
    rec["cancel_requested"] = rec.pop("cancel", None) == "1"
    rec["unreadable"] = sorted(set(bad))
    rec["invalid"] = invalid
    rec.setdefault("id", raw.get("id", ""))
    try:
        return JobView.model_validate(rec)
    except ValidationError as exc:
        # A hand-written or hostile record: keep what validates, name the rest.
        fields = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
        for name in fields:
            rec[name] = None
        rec["unreadable"] = sorted(set(bad) | fields)
        return JobView.model_validate(rec)


class CancelView(BaseModel):
    """``snugfit cancel --json``: ``result`` is ``cancelled``, ``requested`` (running: its
    worker stops it) or the final state the job already had."""

    model_config = ConfigDict(extra="forbid")

    id: str
    result: str


class LogsView(BaseModel):
    """``snugfit logs --json``: the captured stdout+stderr tail (at most 1 MiB) of the job's
    latest attempt."""

    model_config = ConfigDict(extra="forbid")

    id: str
    state: str
    attempt: int | None
    text: str


class LogChunk(BaseModel):
    """``snugfit logs -f --json``: one line per event. ``kind`` is ``output`` (new text of
    ``attempt``), ``state`` (the job moved to ``state``; ``reason`` says why) or ``end`` (the
    job finished in ``state``; the last line)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: str
    ts: float
    attempt: int | None = None
    state: str | None = None
    text: str | None = None
    reason: str | None = None
    #: output between the previous chunk and this one was lost (more than the 1 MiB tail was
    #: written between two reads).
    truncated: bool = False


class NodeView(BaseModel):
    """``snugfit node ACTION NAME --json``: the node's operator state after the action
    (``null``: in service)."""

    model_config = ConfigDict(extra="forbid")

    node: str
    action: str
    admin_state: str | None
