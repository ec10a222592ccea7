"""Reading a pending job record back from Redis into a :class:`PlacementRequest`.

Anyone who can write to Redis can put anything under a pending id, so every field is checked;
what fails becomes :class:`InvalidRecord`, which the leader turns into a rejection, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import ValidationError

from predictor.internode import GradientSync
from predictor.limits import MAX_VRAM_GIB
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest, requested_type
from scheduler.exceptions import PlacementError
from scheduler.service.store.records import RequestRecord, parse_engine

__all__ = [
    "MAX_REQUEST_BYTES",
    "InvalidRecord",
    "RequestDecoder",
    "decode_engine",
    "decode_request",
]

#: Larger request fields than this are hostile or broken; they are rejected unread.
MAX_REQUEST_BYTES = 64 * 1024


class InvalidRecord(Exception):
    """A pending entry that is not a valid snugfit job (internal; becomes a rejection)."""


def _inf(xs: Sequence[float | None]) -> np.ndarray:
    return np.array([math.inf if x is None else float(x) for x in xs], dtype=np.float64)


class RequestDecoder:
    """:func:`decode_request` for one pool, decoding each distinct ``request`` field (with its
    ``reserved_gib``) once: a burst of identical jobs then costs one parse and one request,
    copied per job under its own id and submit time. Every per-job field is still checked,
    in the same order, so a job gets the answer :func:`decode_request` gives it."""

    def __init__(self, pool: Pool, size: int = 1024) -> None:
        self.pool = pool
        self.size = size
        self._seen: dict[tuple[str, str | None], PlacementRequest] = {}

    def __call__(
        self,
        jid: str,
        st: str | None,
        attempt: str | None,
        submitted: str | None,
        reserved: str | None,
        raw: str | None,
    ) -> PlacementRequest:
        _check_listing(st, raw)
        assert raw is not None
        proto = self._seen.get((raw, reserved))
        if proto is None:
            req = decode_request(self.pool, jid, st, attempt, submitted, reserved, raw)
            if len(self._seen) >= self.size:
                self._seen.clear()
            self._seen[(raw, reserved)] = req
            return req
        try:
            # The record parsed and the request built for this very text: only the job's own
            # numbers are read (and checked) again.
            att, t, _ = _numbers(attempt, submitted, reserved)
        except ValueError as exc:
            raise InvalidRecord(f"malformed record: {str(exc).splitlines()[0][:200]}") from None
        _check_numbers(att, t, proto.reserved_gib)
        return proto.with_identity(jid, t)


def _check_listing(st: str | None, raw: str | None) -> None:
    if st is None:
        raise InvalidRecord("no job record behind this pending id")
    if st != "pending":
        raise InvalidRecord(f"listed as pending but its record says {st[:40]!r}")
    if raw is None:
        raise InvalidRecord("the record has no `request` field; submit jobs through snugfit")
    if len(raw) > MAX_REQUEST_BYTES:
        raise InvalidRecord(f"`request` is {len(raw)} bytes (> {MAX_REQUEST_BYTES}); refused")


def _numbers(
    attempt: str | None, submitted: str | None, reserved: str | None
) -> tuple[int, float, float | None]:
    return (
        int(attempt or "0"),
        float(submitted or "nan"),
        None if reserved is None else float(reserved),
    )


def _check_numbers(att: int, t: float, floor: float | None) -> None:
    if not math.isfinite(t) or att < 0:
        raise InvalidRecord("malformed record: bad submitted_at or attempt")
    if floor is not None and not (math.isfinite(floor) and 0 <= floor <= MAX_VRAM_GIB):
        raise InvalidRecord(
            f"malformed record: reserved_gib must be finite and in [0, {MAX_VRAM_GIB:g}]; "
            f"got {floor!r}"
        )


def decode_request(
    pool: Pool,
    jid: str,
    st: str | None,
    attempt: str | None,
    submitted: str | None,
    reserved: str | None,
    raw: str | None,
) -> PlacementRequest:
    """The request behind pending id ``jid`` from its record's fields, or InvalidRecord."""
    _check_listing(st, raw)
    assert raw is not None
    try:
        rr = RequestRecord.model_validate_json(raw)
        att, t, floor = _numbers(attempt, submitted, reserved)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "request"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InvalidRecord(f"malformed record: `{where}`: {msg}"[:300]) from None
    except ValueError as exc:
        raise InvalidRecord(f"malformed record: {str(exc).splitlines()[0][:200]}") from None
    _check_numbers(att, t, floor)
    try:
        upper = _inf(rr.vram_upper_gib)
        return PlacementRequest(
            job_id=jid,
            vram_gib=_inf(rr.vram_gib),
            vram_upper_gib=upper,
            runtime_s=_inf(rr.runtime_s),
            runtime_upper_s=_inf(rr.runtime_upper_s),
            n_gpus=rr.n_gpus,
            tensor_parallel=rr.tensor_parallel,
            pipeline_parallel=rr.pipeline_parallel,
            gpu=rr.gpu,
            # Records written before requested_gpu existed: the shared definition decides.
            requested_gpu=rr.requested_gpu or requested_type(upper, rr.n_gpus, rr.gpu, pool),
            priority=rr.priority,
            deadline_s=rr.deadline_s,
            submit_time_s=t,
            reserved_gib=floor,
            busy_frac=None if rr.busy_frac is None else _inf(rr.busy_frac),
            cpus=rr.cpus,
            host_memory_gib=rr.host_memory_gib,
            host_memory_floor_gib=rr.host_memory_floor_gib,
            sync=None if rr.sync is None else _sync(rr),
            node_selector=rr.node_selector,
        )
    except PlacementError as exc:
        raise InvalidRecord(str(exc)) from None


def _sync(rr: RequestRecord) -> GradientSync:
    """The record's inter-node traffic; the layout comes from the request's own fields (older
    records carry no pipeline figures: no activation traffic is priced for them)."""
    v = rr.sync
    assert v is not None
    act, micro = (v[4], max(v[5], 1.0)) if len(v) == 6 else (0.0, 1.0)
    return GradientSync(
        v[0], v[1], max(1, int(v[2])), v[3], rr.pipeline_parallel, rr.tensor_parallel, act, micro
    )


def decode_engine(raw: str | None) -> dict[str, str] | None:
    """A serving replica's ``engine`` field (None for batch jobs), or InvalidRecord."""
    try:
        return parse_engine(raw)
    except ValueError as exc:
        raise InvalidRecord(f"malformed record: {str(exc).splitlines()[0][:200]}") from None
