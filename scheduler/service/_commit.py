"""The one record of a placement, and every form derived from it.

A placed :class:`~scheduler.core.decision.Decision` becomes a :class:`PlacementRecord` (the
job record's ``placement``); the allocation and the Lua arguments the commit checks capacity
with, the RQ ``job.meta`` and the ``placed`` event are each built from that record alone, by
one function here, so the forms cannot drift apart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import orjson

from scheduler.core.decision import Decision, Option, option_label
from scheduler.core.pool import MIB_PER_GIB, MILLI_PER_CPU, Pool, gib_to_mib_ceil
from scheduler.service.events import event
from scheduler.service.store.keys import queue_name, rq_job_id
from scheduler.service.store.protocol import Commit, Store
from scheduler.service.store.records import GangRank, PlacementRecord, dumps

__all__ = [
    "COMMIT_CHUNK",
    "alloc_record",
    "build_commit",
    "capacity_rows",
    "commit_chunks",
    "gang_ranks",
    "job_meta",
    "option_dict",
    "placed_event",
    "placement_record",
    "rank_items",
    "record_json",
    "record_option",
    "slot",
]

log = logging.getLogger("snugfit.scheduler")

KIND_CODE = {"whole": 0, "mig": 1, "shared": 2}
#: Commits per pipeline; the lease is renewed between chunks so a long batch keeps it.
COMMIT_CHUNK = 500


def capacity_rows(
    pool: Pool,
) -> tuple[list[tuple[int, int, int, int, int]], list[tuple[int, int, int]]]:
    """What the store's capacity counters start from: per GPU (index, MiB, mode code,
    max_shared_jobs, node index) and per node (index, millicores, host MiB)."""
    gpus = [
        (
            g,
            int(pool.capacity_mib[g]),
            int(pool.gpu_mode[g]),
            int(pool.max_shared[g]),
            int(pool.gpu_node[g]),
        )
        for g in range(pool.n_gpus)
    ]
    nodes = [
        (k, int(pool.node_cpu_milli[k]), int(pool.node_host_mib[k])) for k in range(len(pool.nodes))
    ]
    return gpus, nodes


def slot(pool: Pool, opt: Option) -> tuple[int, int, int]:
    """(kind code, MiB taken per GPU, MIG mask) exactly as PoolState.allocate counts it."""
    kind = KIND_CODE[opt.kind]
    g = opt.gpu_indices[0]
    if kind == 0:
        return kind, int(pool.capacity_mib[g]), 0
    if kind == 1:
        assert opt.mig_profile is not None and opt.mig_start is not None
        k, used = pool.mig_instance(g, opt.mig_profile, opt.mig_start)
        return kind, used, int(pool.cand_mask[k])
    return kind, gib_to_mib_ceil(opt.reserved_gib), 0


#: The fields a placement record copies from its option unchanged, and gives back to the
#: option :func:`record_option` rebuilds (the rest are converted or belong to one side).
_AS_IS = (  # in Option's field order
    "kind",
    "gpu_type",
    "node",
    "mig_profile",
    "capacity_gib",
    "reserved_gib",
    "vram_gib",
    "vram_upper_gib",
    "runtime_s",
    "cost_usd",
    "mig_start",
    "leftover_gib",
    "cpus",
    "host_memory_gib",
)
_as_is = attrgetter(*_AS_IS)


def placement_record(
    pool: Pool,
    d: Decision,
    attempt: int,
    *,
    now: float,
    policy: str,
    simulated: bool,
    engine: dict[str, str] | None = None,
) -> PlacementRecord:
    """The record of ``d``'s placement as attempt ``attempt`` (built unvalidated: it comes from
    the core, and every reader validates it)."""
    opt = d.chosen_option
    assert opt is not None and opt.node is not None, f"{d.job_id} is not placed"
    _, used, mask = slot(pool, opt)
    runner = d.runner_up_option
    gang = gang_ranks(pool, d.job_id, attempt, opt) if opt.n_nodes > 1 else None
    return _construct(
        {
            "attempt": attempt,
            "node": opt.node,
            "queue": queue_name(opt.node),
            "rq_job_id": rq_job_id(d.job_id, attempt),
            "label": opt.label,
            "kind": opt.kind,
            "gpu_type": opt.gpu_type,
            "gpu_indices": list(opt.gpu_indices),
            "mig_profile": opt.mig_profile,
            "mig_start": opt.mig_start,
            "reserved_gib": opt.reserved_gib,
            "capacity_gib": opt.capacity_gib,
            "cost_usd": opt.cost_usd,
            "runtime_s": opt.runtime_s,
            "placed_at": now,
            "policy": policy,
            "simulated": simulated,
            "job_id": d.job_id,
            "n_gpus": opt.n_gpus,
            "vram_gib": opt.vram_gib,
            "vram_upper_gib": opt.vram_upper_gib,
            "leftover_gib": opt.leftover_gib,
            "used_mib": used,
            "mig_mask": mask,
            "reason": d.reason,
            "runner_up": None if runner is None else runner.to_dict(),
            "engine": engine,
            "cpus": opt.cpus,
            "host_memory_gib": opt.host_memory_gib,
            "gang": gang,
            "master_port": None if gang is None else master_port(d.job_id, attempt),
        }
    )


_RECORD_FIELDS = tuple(PlacementRecord.model_fields)
_RECORD_FIELD_SET = frozenset(_RECORD_FIELDS)


def _construct(values: dict[str, Any]) -> PlacementRecord:
    """``PlacementRecord.model_construct(**values)`` for ``values`` holding every field in the
    model's field order: what model_construct builds, without its per-field default and alias
    handling (the leader builds thousands a second). ``test_commit`` checks the two build equal
    records."""
    assert tuple(values) == _RECORD_FIELDS, "a placement record names every field, in order"
    rec = PlacementRecord.__new__(PlacementRecord)
    object.__setattr__(rec, "__dict__", values)
    object.__setattr__(rec, "__pydantic_fields_set__", set(_RECORD_FIELD_SET))
    object.__setattr__(rec, "__pydantic_extra__", None)
    object.__setattr__(rec, "__pydantic_private__", None)
    return rec


def record_json(rec: PlacementRecord) -> str:
    """``rec.model_dump_json()``; a record without a gang (plain values only) is written by
    orjson, which gives the same JSON at a fraction of the cost."""
    if rec.gang is not None:
        return rec.model_dump_json()
    return orjson.dumps(rec.__dict__, option=orjson.OPT_SERIALIZE_NUMPY).decode()


#: torchrun's default rendezvous port; a gang's port is drawn above it per (job, attempt) so
#: two gangs whose master shares a node do not collide (and a retry does not meet a dying one).
_PORT_BASE, _PORT_SPAN = 29500, 2000


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of a gang attempt: stable, so every rank computes the same one."""
    import zlib

    return _PORT_BASE + zlib.crc32(f"{job_id}@{attempt}".encode()) % _PORT_SPAN


def gang_ranks(pool: Pool, job_id: str, attempt: int, opt: Option) -> list[GangRank]:
    """A multi-node option's nodes in rank order: the GPUs run node by node
    (``gpu_indices`` order), node 0's RQ job keeps the attempt's ordinary id."""
    per_node: dict[int, list[int]] = {}
    for g in opt.gpu_indices:
        per_node.setdefault(int(pool.gpu_node[g]), []).append(int(g))
    out: list[GangRank] = []
    offset = 0
    base = rq_job_id(job_id, attempt)
    for rank, (k, gpus) in enumerate(per_node.items()):
        name = pool.nodes[k].name
        out.append(
            GangRank(
                node=name,
                queue=queue_name(name),
                rq_job_id=base if rank == 0 else f"{base}-n{rank}",
                node_rank=rank,
                rank_offset=offset,
                gpu_indices=gpus,
            )
        )
        offset += len(gpus)
    return out


def rank_items(rec: PlacementRecord) -> list[tuple[str, str, int, dict[str, Any]]]:
    """The RQ jobs of a placement, ``(node, job id, attempt, meta)``: one, or one per node of
    a gang (each meta names its node's rank and RQ id)."""
    assert rec.job_id is not None
    meta = job_meta(rec)
    if rec.gang is None:
        return [(rec.node, rec.job_id, rec.attempt, meta)]
    items = []
    for r in rec.gang:
        m = dict(meta, node=r.node, gpus=r.gpu_indices, node_rank=r.node_rank)
        m["rq_job_id"] = r.rq_job_id
        items.append((r.node, rec.job_id, rec.attempt, m))
    return items


def record_option(rec: PlacementRecord) -> Option:
    """The committed option, rebuilt from the record (it fits now, so its reason is empty)."""
    return Option(
        **dict(zip(_AS_IS, _as_is(rec), strict=True)),
        gpu_indices=tuple(rec.gpu_indices),
        n_gpus=rec.n_gpus if rec.n_gpus is not None else len(rec.gpu_indices),
        fits_now=True,
        fits_empty=True,
        reason="",
        n_nodes=rec.n_nodes,
    )


def _finite(v: float | None) -> float | None:
    # As Option.to_dict: JSON has no inf/NaN, an unknown figure is stored as null.
    return None if isinstance(v, float) and not math.isfinite(v) else v


def option_dict(rec: PlacementRecord) -> dict[str, Any]:
    """``record_option(rec).to_dict()`` built straight from the record (no Option object):
    the allocation and the ``placed`` event both carry it. ``test_commit`` checks the two
    are equal."""
    return {
        "kind": rec.kind,
        "gpu_type": rec.gpu_type,
        "node": rec.node,
        "gpu_indices": list(rec.gpu_indices),
        "mig_profile": rec.mig_profile,
        "n_gpus": rec.n_gpus if rec.n_gpus is not None else len(rec.gpu_indices),
        "capacity_gib": rec.capacity_gib,
        "reserved_gib": rec.reserved_gib,
        "vram_gib": _finite(rec.vram_gib),
        "vram_upper_gib": _finite(rec.vram_upper_gib),
        "runtime_s": _finite(rec.runtime_s),
        "cost_usd": _finite(rec.cost_usd),
        "fits_now": True,
        "fits_empty": True,
        "reason": "",
        "mig_start": rec.mig_start,
        "leftover_gib": _finite(rec.leftover_gib),
        "cpus": _finite(rec.cpus),
        "host_memory_gib": _finite(rec.host_memory_gib),
        "n_nodes": rec.n_nodes,
    }


def alloc_record(rec: PlacementRecord) -> dict[str, Any]:
    """The ``P:allocs`` entry: what the commit adds, what every release takes back.

    ``cpu_milli`` and ``host_mib`` are charged to each node of the allocation's GPUs, exactly
    as PoolState.allocate counts them (the option's figures are whole millicores and MiB)."""
    return {
        "attempt": rec.attempt,
        "kind": KIND_CODE[rec.kind],
        "gpus": rec.gpu_indices,
        "used_mib": rec.used_mib,
        "reserved_mib": gib_to_mib_ceil(rec.reserved_gib),
        "mig_mask": rec.mig_mask,
        "cpu_milli": 0 if rec.cpus is None else round(rec.cpus * MILLI_PER_CPU),
        "host_mib": 0 if rec.host_memory_gib is None else round(rec.host_memory_gib * MIB_PER_GIB),
        "option": option_dict(rec),
    }


def build_commit(rec: PlacementRecord, expected_attempt: int, decision_json: str) -> Commit:
    """The atomic commit of ``rec``: capacity, allocation and job record in one script."""
    assert rec.job_id is not None and rec.used_mib is not None
    return Commit(
        job_id=rec.job_id,
        expected_attempt=expected_attempt,
        alloc_json=dumps(alloc_record(rec)),
        placement_json=record_json(rec),
        decision_json=decision_json,
    )


def commit_chunks(
    store: Store,
    n: int,
    build: Callable[[int], Sequence[Commit]],
    token: str,
    still_leader: Callable[[], bool],
    *,
    fenced: bool = True,
    settle: Callable[[int, list[str]], None] | None = None,
) -> tuple[list[str], Exception | None]:
    """Commit ``n`` placements in chunks of :data:`COMMIT_CHUNK` (one atomic script each),
    re-checking the lease between chunks; ``build(start)`` makes the chunk from ``start``.

    A store with ``commit_send`` runs chunk k while the next chunk is built: the same scripts
    in the same order, each answered (and the lease re-checked) before the next is sent.
    ``settle(start, answers)``, when given, gets each chunk's answers in chunk order as they
    arrive, once the next chunk is sent (so the caller settles chunk k while Redis runs chunk
    k+1). Returns the answers of the chunks sent, in order, and what a build, a store call or
    a settle raised (None when nothing did): every chunk answered before the failure is
    settled first, so no job holds capacity without its RQ job because a later chunk failed."""
    send = getattr(store, "commit_send", None)
    results: list[str] = []
    pending: tuple[int, Callable[[], list[str]]] | None = None
    answered: tuple[int, list[str]] | None = None  # answers not yet settled
    lost = False

    def settled() -> None:
        nonlocal answered
        if answered is not None:
            start, answers = answered
            answered = None
            results.extend(answers)
            if settle is not None:
                settle(start, answers)

    def read() -> None:
        nonlocal pending, answered
        if pending is not None:
            (start, answers), pending = pending, None
            answered = (start, answers())

    try:
        for start in range(0, n, COMMIT_CHUNK):
            chunk = build(start)
            read()
            if lost or (start and not still_leader()):
                lost = True
                settled()
                answered = (start, ["err:lease lost during commit"] * len(chunk))
            elif send is None:
                answered = (start, store.commit(chunk, token, fenced=fenced))
            else:
                pending = (start, send(chunk, token, fenced=fenced))
            settled()
        read()
        settled()
    except Exception as exc:
        try:
            settled()
            read()
            settled()
        except Exception as again:  # the first failure is the one raised; this one is logged
            log.warning("settling the commits sent before a failure failed too: %s", again)
        return results, exc
    return results, None


_OPTION_KEYS = frozenset(f for f in Option.__dataclass_fields__ if not f.startswith("_"))
_KINDS = frozenset(KIND_CODE)


def _runner_up_line(rec: PlacementRecord) -> str | None:
    ru = rec.runner_up
    if ru is None:
        return None
    if ru.keys() == _OPTION_KEYS and ru["kind"] in _KINDS:
        # What Option.to_dict wrote (every field, a known kind): the label straight from it.
        label = option_label(
            ru["kind"], ru["gpu_type"], ru["mig_profile"], ru["n_gpus"], ru["n_nodes"]
        )
    else:
        label = Option.from_dict(ru).label  # anything else is checked (and refused) as before
    return f"{label}: {ru.get('reason', '')}"


def job_meta(rec: PlacementRecord) -> dict[str, Any]:
    """The RQ ``job.meta`` a worker and ``rq info`` read."""
    cost = None if rec.cost_usd is None else round(rec.cost_usd, 4)
    meta: dict[str, Any] = {
        "snugfit_job": rec.job_id,
        "attempt": rec.attempt,
        "placement": rec.label,
        "node": rec.node,
        "gpus": rec.gpu_indices,
        "reserved_gib": round(rec.reserved_gib, 3),
        "cost_usd": cost,
        "reason": rec.reason,
        "runner_up": _runner_up_line(rec),
        "policy": rec.policy,
        "simulated": rec.simulated,
    }
    if rec.engine is not None:
        meta["engine"] = rec.engine  # a serving replica: the command's placeholder values
    return meta


def placed_event(rec: PlacementRecord) -> dict[str, Any]:
    """The ``placed`` event of the placement log."""
    return event(
        "placed",
        rec.job_id,
        attempt=rec.attempt,
        node=rec.node,
        option=option_dict(rec),
        cost_usd=rec.cost_usd,
        runner_up=rec.runner_up,
        reason=rec.reason,
        policy=rec.policy,
        simulated=rec.simulated,
    )
