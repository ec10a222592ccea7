"""What the leader writes when it commits a placement, one small function per form.

A placed Decision becomes a :class:`PlacementRecord` (the job record's ``placement``), the
allocation the Lua commit checks capacity with, the RQ ``job.meta`` and the ``placed`` event.
Each is derived from the committed :class:`Option` and the record, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scheduler.core.decision import Decision, Option
from scheduler.core.pool import Pool, gib_to_mib_ceil
from scheduler.service.events import event
from scheduler.service.store.keys import queue_name, rq_job_id
from scheduler.service.store.protocol import Commit, Store
from scheduler.service.store.records import PlacementRecord, dumps

__all__ = [
    "COMMIT_CHUNK",
    "build_commit",
    "commit_chunks",
    "job_meta",
    "placed_event",
    "placement_record",
    "slot",
]

_KIND_CODE = {"whole": 0, "mig": 1, "shared": 2}
#: Commits per pipeline; the lease is renewed between chunks so a long batch keeps it.
COMMIT_CHUNK = 500


def slot(pool: Pool, opt: Option) -> tuple[int, int, int]:
    """(kind code, MiB taken per GPU, MIG mask) exactly as PoolState.allocate counts it."""
    kind = _KIND_CODE[opt.kind]
    g = opt.gpu_indices[0]
    if kind == 0:
        return kind, int(pool.capacity_mib[g]), 0
    if kind == 1:
        assert opt.mig_profile is not None and opt.mig_start is not None
        k, used = pool.mig_instance(g, opt.mig_profile, opt.mig_start)
        return kind, used, int(pool.cand_mask[k])
    return kind, gib_to_mib_ceil(opt.reserved_gib), 0


def placement_record(
    job_id: str,
    opt: Option,
    attempt: int,
    *,
    now: float,
    policy: str,
    simulated: bool,
    engine: dict[str, str] | None = None,
) -> PlacementRecord:
    assert opt.node is not None
    return PlacementRecord(
        attempt=attempt,
        node=opt.node,
        queue=queue_name(opt.node),
        rq_job_id=rq_job_id(job_id, attempt),
        label=opt.label,
        kind=opt.kind,
        gpu_type=opt.gpu_type,
        gpu_indices=list(opt.gpu_indices),
        mig_profile=opt.mig_profile,
        mig_start=opt.mig_start,
        reserved_gib=opt.reserved_gib,
        capacity_gib=opt.capacity_gib,
        cost_usd=opt.cost_usd,
        runtime_s=opt.runtime_s,
        placed_at=now,
        policy=policy,
        simulated=simulated,
        engine=engine,
    )


def build_commit(
    pool: Pool, d: Decision, opt: Option, expected_attempt: int, rec: PlacementRecord
) -> Commit:
    """The atomic commit of ``opt`` for ``d``: capacity, allocation and record in one script."""
    kind, used, mask = slot(pool, opt)
    reserved_mib = gib_to_mib_ceil(opt.reserved_gib)
    alloc = {
        "attempt": rec.attempt,
        "kind": kind,
        "gpus": list(opt.gpu_indices),
        "used_mib": used,
        "reserved_mib": reserved_mib,
        "mig_mask": mask,
        "option": opt.to_dict(),
    }
    return Commit(
        job_id=d.job_id,
        expected_attempt=expected_attempt,
        kind=kind,
        gpus=tuple(opt.gpu_indices),
        used_mib=used,
        reserved_mib=reserved_mib,
        mig_mask=mask,
        alloc_json=dumps(alloc),
        placement_json=rec.model_dump_json(),
        decision_json=dumps(d.to_dict(compact=True)),
    )


def commit_chunks(
    store: Store, commits: Sequence[Commit], token: str, still_leader: Callable[[], bool]
) -> list[str]:
    """Commit in chunks of :data:`COMMIT_CHUNK`, re-checking the lease between chunks."""
    results: list[str] = []
    for start in range(0, len(commits), COMMIT_CHUNK):
        if start and not still_leader():
            results += ["err:lease lost during commit"] * (len(commits) - start)
            break
        results += store.commit(commits[start : start + COMMIT_CHUNK], token)
    return results


def _runner_up(d: Decision) -> Option | None:
    return d.options[d.runner_up] if d.runner_up is not None else None


def job_meta(d: Decision, rec: PlacementRecord, opt: Option, simulated: bool) -> dict[str, Any]:
    """The RQ ``job.meta`` a worker and ``rq info`` read."""
    runner = _runner_up(d)
    cost = None if opt.cost_usd is None else round(opt.cost_usd, 4)
    meta = {
        "snugfit_job": d.job_id,
        "attempt": rec.attempt,
        "placement": opt.label,
        "node": rec.node,
        "gpus": rec.gpu_indices,
        "reserved_gib": round(opt.reserved_gib, 3),
        "cost_usd": cost,
        "reason": d.reason,
        "runner_up": None if runner is None else f"{runner.label}: {runner.reason}",
        "policy": rec.policy,
        "simulated": simulated,
    }
    if rec.engine is not None:
        meta["engine"] = rec.engine  # a serving replica: the command's placeholder values
    return meta


def placed_event(d: Decision, rec: PlacementRecord, opt: Option, simulated: bool) -> dict[str, Any]:
    """The ``placed`` event of the placement log."""
    runner = _runner_up(d)
    return event(
        "placed",
        d.job_id,
        attempt=rec.attempt,
        node=rec.node,
        option=opt.to_dict(),
        cost_usd=opt.cost_usd,
        runner_up=None if runner is None else runner.to_dict(),
        reason=d.reason,
        policy=rec.policy,
        simulated=simulated,
    )
