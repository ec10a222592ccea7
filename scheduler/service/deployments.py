"""Serving deployments: a ``task: serve`` job planned at submit and run as replica gangs.

Submitting a serve spec plans it (:func:`predictor.serving.plan`) over the GPU types of the pool
the scheduler runs, keeping only options that pool can host (a TP group inside one node of the
type, or a MIG profile its MIG nodes offer), and chooses the cheapest that meets the SLO. Each
replica is then an ordinary job record ``{id}-r{k}`` whose request pins the chosen option: the
GPU type, ``n_gpus = tensor_parallel = TP`` (one gang in one node) or one GPU for a MIG slice,
reserving the whole slot, since the engine pre-allocates its memory fraction of it and needs the
slot's compute to meet the SLO. Replicas go through the same placement, atomic commit, RQ queue
and worker as batch jobs, so deployments and batch jobs share one pool and one set of rules.

A replica holds its slot until cancelled or until the deployment's ``duration_s`` runs out: the
leader calls :func:`expire_due` each step, which cancels the replicas of every deployment due. The
chosen option's engine values (:data:`predictor.serving.ENGINE_PLACEHOLDERS`) travel in the
replica record's ``engine`` field into its placement and RQ ``job.meta``, for the worker to fill
the command's placeholders. :meth:`Deployments.scale` re-plans the replica count for a new rate;
rate 0 scales to zero replicas, whose price is the cold start the next request waits.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from predictor.gpus import GPU_NAMES
from scheduler.exceptions import JobNotFoundError, ServiceError
from scheduler.service.events import event
from scheduler.service.store.deployments import DeploymentStore
from scheduler.service.store.keys import ACTIVE_STATES
from scheduler.service.store.records import dumps

if TYPE_CHECKING:
    from predictor.serving import PlanOption, ServingPlan
    from predictor.spec import JobSpec
    from scheduler.core.pool import Pool

__all__ = [
    "PRICING_HORIZON_S",
    "DeploymentHandle",
    "DeploymentView",
    "Deployments",
    "ScaleResult",
    "expire_due",
    "hostable",
    "plan_for_pool",
]

#: What an until-cancelled replica is priced over by the placer (its cost per hour).
PRICING_HORIZON_S = 3600.0

_MIB = 1024.0


def hostable(o: PlanOption, pool: Pool | None) -> bool:
    """Whether some node of ``pool`` can hold one replica of option ``o`` (any node when there
    is no pool yet)."""
    if pool is None:
        return True
    for node in pool.nodes:
        if node.gpu_type != o.gpu:
            continue
        if o.mig_profile is None:
            # A TP gang needs whole GPUs in one node; one GPU may also be a shared one.
            if node.count >= o.n_gpus and (
                node.mode == "whole" or (node.mode == "shared" and o.n_gpus == 1)
            ):
                return True
        elif node.mode == "mig" and (
            node.mig_layout is None
            or any(p == o.mig_profile for gpu in node.mig_layout for p, _ in gpu)
        ):
            return True
    return False


def plan_for_pool(spec: JobSpec, pool: Pool | None) -> tuple[ServingPlan, int | None, str]:
    """The plan over the pool's GPU types, the index of the cheapest option meeting the SLO that
    the pool can host, and the reason (why it won, or why nothing could)."""
    from predictor.serving import plan

    types = None if pool is None else [g for g in GPU_NAMES if g in pool.types_present()]
    p = plan(spec, types)
    if p.chosen is None:
        return p, None, p.reason
    for k, o in enumerate(p.options):  # sorted: SLO-meeting options first, cheapest first
        if o.meets_slo and hostable(o, pool):
            if k == p.chosen:
                return p, k, p.reason
            return (
                p,
                k,
                (
                    f"{o.where} TP{o.n_gpus} x{o.replicas}: the cheapest option this pool can host "
                    f"(the planner's choice, {p.options[p.chosen].shape.label}, is not in the pool)"
                ),
            )
    return (
        p,
        None,
        (
            f"no option meeting the SLO fits a node of this pool ({p.reason}); add nodes of that "
            "type, or relax the SLO"
        ),
    )


def _pool_contract(p: ServingPlan, k: int, pool: Pool | None) -> dict[str, Any]:
    """The plan's contract object with option ``k`` chosen and every status said against the
    pool: options no node can host say so, the others are priced against ``k``."""
    contract = p.to_contract()
    contract["chosen"] = k
    best = p.options[k]
    for j, (o, c) in enumerate(zip(p.options, contract["options"], strict=True)):
        if j == k:
            c["status"] = "CHOSEN"
        elif not o.meets_slo:
            continue
        elif not hostable(o, pool):
            need = f"MIG {o.mig_profile}" if o.mig_profile else f"{o.n_gpus} GPU(s) in one node"
            c["status"] = f"not in this pool: no {o.gpu} node with {need}"
        elif round(o.usd_per_hour, 6) > round(best.usd_per_hour, 6):
            c["status"] = f"costlier: ${o.usd_per_hour:.2f}/h vs ${best.usd_per_hour:.2f}/h"
    return contract


def _slot_gib(o: PlanOption) -> float:
    # Exactly the pool's capacity of the slot (whole GPU or MIG slice), as the pool floors it.
    return math.floor(o.shape.slot.memory_gib * _MIB) / _MIB


def _replica_record(
    dep_id: str, rid: str, spec: JobSpec, o: PlanOption, engine: dict[str, str], now: float
) -> dict[str, str]:
    t = GPU_NAMES.index(o.gpu)
    slot = _slot_gib(o)
    runtime = spec.duration_s or PRICING_HORIZON_S

    def only(x: float) -> list[float | None]:
        return [x if i == t else None for i in range(len(GPU_NAMES))]

    mem = o.memory
    breakdown = {
        "weights": round(mem.weights_gib, 3),
        "activations": round(mem.activations_gib, 3),
        "kv_cache": round(mem.kv_pool_gib, 3),
        "overhead": round(mem.fixed_gib, 3),
    }
    peak = min(slot, sum(breakdown.values()))
    prediction = {
        "id": rid,
        "gpu": o.gpu,
        "fits": True,
        "peak_vram_gib": round(peak, 3),
        "peak_vram_upper_gib": slot,
        "breakdown_gib": breakdown,
        "runtime_s": runtime,
        "runtime_upper_s": runtime,
        "ttft_s": o.point.ttft_p95_s if math.isfinite(o.point.ttft_p95_s) else None,
        "tpot_s": o.point.tpot_p95_s if math.isfinite(o.point.tpot_p95_s) else None,
        "method": "serving-plan",
    }
    request = {
        "vram_gib": only(peak),
        "vram_upper_gib": only(slot),
        "runtime_s": only(runtime),
        "runtime_upper_s": only(runtime),
        # Wall time, not work: a replica does not stretch on a smaller slice.
        "busy_frac": only(0.0),
        "n_gpus": o.n_gpus,
        "tensor_parallel": o.n_gpus,
        "pipeline_parallel": 1,
        "gpu": o.gpu,
        "requested_gpu": o.gpu,
        "priority": spec.priority,
        "deadline_s": None,
        "cpus": spec.cpus,
        "host_memory_gib": spec.host_memory_gib,
    }
    if spec.node_selector:
        request["node_selector"] = {k: list(v) for k, v in spec.node_selector.items()}
    ts = repr(now)
    return {
        "id": rid,
        "submitted_at": ts,
        "updated_at": ts,
        "spec": dumps({**spec.to_dict(), "id": rid}),
        "request": dumps(request),
        "predictions": dumps({o.gpu: prediction}),
        "method": "serving-plan",
        "attempt": "0",
        "max_retries": "2",
        "max_oom_retries": "0",
        "deployment": dep_id,
        "engine": dumps(engine),
    }


@dataclass(frozen=True)
class DeploymentView:
    """A deployment as read back: its record, the chosen option and its replicas' states."""

    id: str
    state: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    chosen: int
    replicas: int
    request_rate: float
    engine: dict[str, str]
    created_at: float
    expires_at: float | None
    reason: str
    replica_states: dict[str, str] = field(default_factory=dict)

    @property
    def option(self) -> dict[str, Any]:
        return dict(self.plan["options"][self.chosen])

    @property
    def live(self) -> list[str]:
        return [r for r, s in self.replica_states.items() if s in ACTIVE_STATES]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "replicas": self.replicas,
            "request_rate": self.request_rate,
            "option": self.option,
            "engine": self.engine,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "reason": self.reason,
            "replica_states": self.replica_states,
        }


@dataclass(frozen=True, slots=True)
class ScaleResult:
    deployment_id: str
    rate: float
    before: int
    after: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    usd_per_hour: float
    cold_start_s: float

    def summary(self) -> str:
        line = (
            f"{self.deployment_id}: {self.before} -> {self.after} replica(s) at {self.rate:g} "
            f"req/s, ${self.usd_per_hour:.2f}/h"
        )
        if self.after == 0:
            line += (
                f"; scaled to zero: the next request waits the cold start, about "
                f"{self.cold_start_s:.0f} s (weights / load bandwidth + engine start)"
            )
        return line


class Deployments:
    """Create, read, scale and cancel deployments on a ``RedisStore``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.records = DeploymentStore(store)

    def _pool(self) -> Pool | None:
        config = self.store.pool_config()
        if config is None:
            return None
        from scheduler.core.pool import Pool

        return Pool.from_dict(config)

    def create(self, spec: JobSpec, *, now: float | None = None) -> str:
        """Plan ``spec`` for the pool and write the deployment with its replicas; idempotent on
        the id. ServiceError (naming the nearest option) when no option can serve it."""
        dep_id = spec.id or uuid.uuid4().hex[:16]
        if self.records.exists(dep_id):
            return dep_id
        spec = spec.model_copy(update={"id": dep_id})
        t = time.time() if now is None else now
        pool = self._pool()
        p, k, reason = plan_for_pool(spec, pool)
        if k is None:
            raise ServiceError(f"deployment {dep_id!r} cannot be placed: {reason}")
        o = p.options[k]
        assert o.replicas is not None
        contract = _pool_contract(p, k, pool)
        contract.update(
            reason=reason,
            engine_flags=p.engine_flags() if k == p.chosen else {},
            skipped=[list(s) for s in p.skipped],
        )
        expires = None if spec.duration_s is None else t + spec.duration_s
        fields = {
            "state": "active",
            "spec": dumps(spec.to_dict()),
            "plan": dumps(contract),
            "chosen": str(k),
            "engine": dumps(p.engine_values(k)),
            "replicas": str(o.replicas),
            "request_rate": repr(spec.request_rate),
            "next_replica": "0",
            "created_at": repr(t),
            "updated_at": repr(t),
            "reason": reason,
        }
        if expires is not None:
            fields["expires_at"] = repr(expires)
        if not self.records.create(dep_id, fields, expires):
            return dep_id
        self._add(dep_id, spec, o, p.engine_values(k), o.replicas, t)
        return dep_id

    def _add(
        self, dep_id: str, spec: JobSpec, o: PlanOption, engine: dict[str, str], n: int, t: float
    ) -> list[str]:
        if n <= 0:
            return []
        ids = [f"{dep_id}-r{k}" for k in self.records.take_replica_indices(dep_id, n)]
        self.store.add_jobs(
            [
                _replica_record(dep_id, rid, spec, o, engine, t + i * 1e-6)
                for i, rid in enumerate(ids)
            ]
        )
        self.store.wake()
        return ids

    def get(self, dep_id: str) -> DeploymentView:
        rec = self.records.get(dep_id)
        if rec is None:
            raise JobNotFoundError(f"no deployment with id {dep_id!r}")
        try:
            rids = self.records.replica_ids(dep_id)
            states = self.store.get_fields(rids, ["state"]) if rids else []
            return DeploymentView(
                id=dep_id,
                state=rec["state"],
                spec=json.loads(rec["spec"]),
                plan=json.loads(rec["plan"]),
                chosen=int(rec["chosen"]),
                replicas=int(rec["replicas"]),
                request_rate=float(rec["request_rate"]),
                engine=json.loads(rec.get("engine") or "{}"),
                created_at=float(rec["created_at"]),
                expires_at=float(rec["expires_at"]) if rec.get("expires_at") else None,
                reason=rec.get("reason", ""),
                replica_states={r: s[0] or "missing" for r, s in zip(rids, states, strict=True)},
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ServiceError(f"deployment {dep_id!r}: unreadable record ({exc!r:.120})") from None

    def exists(self, dep_id: str) -> bool:
        return self.records.exists(dep_id)

    def ids(self) -> list[str]:
        return self.records.ids()

    def scale(self, dep_id: str, rate: float, *, now: float | None = None) -> ScaleResult:
        """Re-plan the replica count of the deployment's option for ``rate`` req/s (0: scale to
        zero) and add or cancel replicas to match."""
        from predictor.serving import plan
        from predictor.spec import parse_spec

        if not (math.isfinite(rate) and rate >= 0):
            raise ServiceError(f"`--rate` must be >= 0 req/s; got {rate!r}")
        d = self.get(dep_id)
        if d.state != "active":
            raise ServiceError(f"deployment {dep_id!r} is {d.state}; submit it again to serve it")
        t = time.time() if now is None else now
        want = d.option
        spec = parse_spec({**d.spec, "request_rate": rate if rate > 0 else d.spec["request_rate"]})
        p = plan(spec, [want["gpu"]])
        same = [
            (k, o)
            for k, o in enumerate(p.to_contract()["options"])
            if all(
                o[key] == want[key]
                for key in (
                    "gpu",
                    "mig_profile",
                    "tensor_parallel",
                    "weight_dtype",
                    "kv_cache_dtype",
                )
            )
        ]
        if not same or same[0][1]["replicas"] is None:
            raise ServiceError(
                f"deployment {dep_id!r}: its option {want['gpu']} {want.get('mig_profile') or ''} "
                f"TP{want['tensor_parallel']} no longer meets the SLO; submit a new deployment"
            )
        k, opt = same[0]
        target = int(opt["replicas"]) if rate > 0 else 0
        live = d.live
        added: list[str] = []
        removed: list[str] = []
        if target > len(live):
            spec_obj = parse_spec(d.spec)
            added = self._add(dep_id, spec_obj, p.options[k], d.engine, target - len(live), t)
        elif target < len(live):
            removed = self._cancel(
                _newest_idle_first(live, d.replica_states)[: len(live) - target],
                f"scaled down to {target} replica(s)",
            )
        per_replica = float(want["usd_per_hour"]) / max(1, int(want["replicas"]))
        self.records.set_fields(
            dep_id,
            {"replicas": str(target), "request_rate": repr(rate), "updated_at": repr(t)},
        )
        return ScaleResult(
            dep_id,
            rate,
            len(live),
            target,
            tuple(added),
            tuple(removed),
            per_replica * target,
            float(want["cold_start_s"] or 0.0),
        )

    def _cancel(self, replica_ids: Sequence[str], reason: str) -> list[str]:
        done = []
        events = []
        for rid in replica_ids:
            got = self.store.cancel(rid, reason)
            if got in ("cancelled", "requested"):
                done.append(rid)
            if got == "cancelled":
                events.append(event("cancelled", rid, reason=reason))
        if events:
            self.store.emit(events)
        return done

    def cancel(
        self, dep_id: str, reason: str = "cancelled by user", state: str = "cancelled"
    ) -> str:
        """End the deployment: every live replica is cancelled (a running one is stopped by its
        worker). Returns the state it ends in, or the one it already had."""
        d = self.get(dep_id)
        if d.state != "active":
            return d.state
        self.records.claim_expiry(dep_id)
        self.records.set_fields(
            dep_id, {"state": state, "reason": reason, "updated_at": repr(time.time())}
        )
        self._cancel(d.live, reason)
        return state


class DeploymentHandle:
    """A submitted deployment (what ``Client.submit`` returns for a ``serve`` spec)."""

    __slots__ = ("_deployments", "id")

    def __init__(self, deployments: Deployments, dep_id: str) -> None:
        self._deployments = deployments
        self.id = dep_id

    def __repr__(self) -> str:
        return f"DeploymentHandle({self.id!r})"

    def view(self) -> DeploymentView:
        return self._deployments.get(self.id)

    def status(self) -> str:
        return self.view().state

    def scale(self, rate: float) -> ScaleResult:
        return self._deployments.scale(self.id, rate)

    def cancel(self) -> str:
        return self._deployments.cancel(self.id)


def _newest_idle_first(live: list[str], states: dict[str, str]) -> list[str]:
    """Replicas to remove first: those holding nothing yet, then placed, then running; newest
    first within each."""
    order = {"pending": 0, "placed": 1, "running": 2}
    return sorted(live, key=lambda r: (order.get(states[r], 3), -int(r.rsplit("-r", 1)[1])))


def expire_due(store: Any, now: float) -> int:
    """Cancel the replicas of every deployment whose ``duration_s`` ran out (the leader's step)."""
    records = DeploymentStore(store)
    due = records.due(now)
    if not due:
        return 0
    deps = Deployments(store)
    n = 0
    for dep_id in due:
        if records.claim_expiry(dep_id):
            deps.cancel(dep_id, "duration_s ran out", state="expired")
            n += 1
    return n
