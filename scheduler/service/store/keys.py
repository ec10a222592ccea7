"""The Redis key layout of the snugfit service (the records themselves: :mod:`.records`).

Everything the client, the scheduler service, the workers and the operator commands
(``snugfit log / explain / pool``) share lives under one prefix (default ``snugfit``; written
``P`` below). Values are UTF-8 JSON or plain decimal strings, never pickle. Times are Unix epoch
seconds (floats) unless the name ends in ``_ms``.

Keys
====

=================================  ===========================================================
``P:job:{id}``                     HASH, one job record (fields below)
``P:jobs``                         ZSET of every job id ever accepted, score = submitted_at
``P:state:{state}``                SET of job ids per state (one set per state below); moved
                                   only by the Lua scripts, atomically with ``state``
``P:pending``                      ZSET of jobs waiting for placement, score = submitted_at
                                   (the scheduler reads it in that order, a window at a time)
``P:wakeup``                       LIST; the client pushes a token after each submit so the
                                   scheduler's BLPOP returns at once (trimmed to 1 entry)
``P:leader``                       STRING, the leader's token ``host:pid:uuid``; SET NX PX and
                                   renewed by compare-and-extend (Lua)
``P:leases``                       ZSET of running job ids, score = lease expiry (epoch ms);
                                   renewed by the worker's heartbeat, reaped by the leader
``P:pool``                         HASH ``config`` (pool-file mapping as JSON, see
                                   ``scheduler.core.pool.Pool.to_dict``), ``fingerprint`` (sha256 of
                                   the config), ``name``
``P:gpu``                          HASH of per-GPU capacity, GPU index ``g`` as in the pool:
                                   ``{g}:cap`` capacity MiB, ``{g}:mode`` 0 whole / 1 MIG /
                                   2 shared, ``{g}:max_shared`` (shared GPUs), and the live
                                   ``{g}:used`` MiB taken, ``{g}:mig`` 15-bit MIG slice mask,
                                   ``{g}:shared`` jobs on a shared GPU. Changed only by Lua.
``P:allocs``                       HASH job id -> allocation JSON (below): what each job holds
``P:capver``                       STRING counter, bumped by every capacity change, so the
                                   scheduler re-reads ``P:allocs`` only when it moved
``P:events``                       STREAM, the placement log; each entry has one field
                                   ``e`` = event JSON (below). Capped (approximate MAXLEN).
``P:history``                      LIST of measurement rows (JSON, ``datasets/measured``
                                   schema, ``origin = "history"``), appended by workers
``P:logs:{id}``                    STRING, the tail of a job's stdout+stderr (<= 1 MiB)
``P:node:{name}``                  HASH, a registered worker: ``worker``, ``host``, ``pid``,
                                   ``gpus`` (JSON list), ``simulated``, ``heartbeat_at``
``P:nodes``                        SET of node names that ever registered a worker
``P:deploy:{id}``                  HASH, one serving deployment (``task: serve``; see
                                   :mod:`scheduler.service.store.deployments`); its replicas
                                   are ordinary job records ``{id}-r{k}``
``P:deploys``                      ZSET of deployment ids, score = created_at
``P:deploy_expiry``                ZSET of active deployments with a ``duration_s``, score =
                                   expires_at (the leader cancels their replicas when due)
``P:children:{id}``                SET of jobs whose ``depends_on`` waits on job ``id``; emptied
                                   (released or failed, atomically) when ``id`` ends
``P:node_admin``                   HASH node name -> operator state (``cordoned`` | ``draining``)
                                   set by ``snugfit node cordon|drain``, removed by ``uncordon``
RQ ``rq:queue:snugfit:node:{name}``  one RQ queue per node (queue name ``snugfit:node:{name}``),
                                   JSON serializer; RQ job id ``{job id}-a{attempt}`` (see
                                   :func:`rq_job_id`), function
                                   ``workers.execute.run_job``, args ``[job id, attempt]``
=================================  ===========================================================

Job states
==========

``pending``    accepted, waiting for capacity (in ``P:pending``), or held: by a user
               (``hold``) or by parents that have not all succeeded (``deps_left`` > 0); a
               held job is not in ``P:pending`` and its ``reason`` says what it waits on
``placed``     capacity committed in ``P:gpu`` and enqueued on its node's RQ queue
``running``    a worker started it; holds a lease in ``P:leases``
``succeeded``  exit code 0; capacity released; ``outcome`` set
``failed``     non-zero exit, OOM beyond the retry limit, or lease lost beyond the retry limit
``cancelled``  cancelled by a user (a running job is stopped: SIGTERM, then SIGKILL)
``rejected``   the record was invalid or the job fits nowhere in the pool (``reason`` says which)

Transitions: pending -> placed -> running -> succeeded | failed | cancelled; running -> pending
(OOM requeue with a larger reservation, or a dead worker's lease expired with retries left);
placed -> pending (the node's worker vanished before starting it); pending | placed ->
cancelled; pending -> rejected; pending -> failed (a ``depends_on`` parent failed, was
cancelled or rejected: ``reason`` names it); placed | running | succeeded | failed | cancelled
| rejected -> pending (``snugfit requeue``; a running job is stopped by its worker first).
Every transition is one Lua script that checks the current state (and the ``attempt`` fencing
token), so two actors never both win.

Job record (``P:job:{id}`` fields; JSON values marked ``json``)
=================================================================

``id``               the job id (the spec's ``id``, or one the client generated)
``state``            one of the states above
``spec``             json: ``JobSpec.to_dict()``
``request``          json: what the scheduler places (see :class:`RequestRecord`): per-GPU-type
                     arrays aligned with ``predictor.gpus.GPU_NAMES``: ``vram_gib``,
                     ``vram_upper_gib``, ``runtime_s``, ``runtime_upper_s`` (null = no
                     prediction for that type), ``busy_frac`` (share of the runtime that
                     saturates the GPU: what stretches on a MIG slice; optional, 1 when
                     absent), and ``n_gpus``, ``tensor_parallel``,
                     ``pipeline_parallel``, ``gpu``, ``priority``, ``deadline_s``
``predictions``      json: GPU type -> the contract ``Prediction`` dict
``method``           the prediction method (``analytical``, ``learned:...``, ``history:...``);
                     the leader rewrites it to ``history:<n> runs`` when history answers
``history_request``  json: the request arrays as history predicted them at the first ingest
                     (``vram_gib``, ``vram_upper_gib``, ``runtime_s``, ``runtime_upper_s``,
                     ``n_runs``); later attempts are placed from it. Absent without history
``submitted_at``     epoch seconds
``updated_at``       epoch seconds of the last transition
``attempt``          int, bumped at each placement; fences stale workers and RQ job ids
``max_retries``      int, how many lost leases (dead workers) are retried before ``failed``
``lost``             int, leases lost so far
``moved``            int, times the job was moved off a dead or draining node before it
                     started (never counted against ``max_retries``)
``ooms``             int, OOM kills so far (``max_oom_retries`` caps the requeues)
``max_oom_retries``  int
``reserved_gib``     float, reservation floor per GPU after an OOM (absent before the first
                     OOM). An OOM retry at a higher tensor parallel degree rewrites ``spec``
                     (its ``tensor_parallel`` and ``n_gpus``), ``request``, ``predictions``,
                     ``method`` and this floor (at the new layout: it may be lower), drops
                     ``history_request`` and keeps the spec as submitted in
                     ``submitted_spec`` (written once), all in its requeue
``decision``         json: ``Decision.to_dict(compact=True)`` of the latest placement or
                     rejection (every option as columns in ``option_columns``, those that
                     repeat one value over stretches as runs, :mod:`scheduler.core.stored`;
                     ``options`` spells out only the chosen and runner-up, null elsewhere; a
                     reason its row words is a code, :mod:`scheduler.core.reasons`)
``placement``        json: :class:`PlacementRecord` (node, queue, option, env ...)
``worker``           the worker that runs / ran it (a multi-node gang: the first rank's)
``rank:<a>:<r>``     a multi-node gang: the worker that runs node rank ``r`` of attempt ``a``
``done:<a>:<r>``     "1" once node rank ``r`` of attempt ``a`` ended well (``gang_done.lua``:
                     the last one finishes the job)
``gang``             int, times a gang was requeued because one of its ranks failed (capped by
                     ``max_retries``)
``started_at``       epoch seconds, ``finished_at`` epoch seconds
``outcome``          json: :class:`OutcomeRecord` (peak VRAM, runtime, exit code, OOM,
                     ``simulated``)
``reason``           why it failed / was rejected / cancelled / requeued (human text)
``cancel``           "1" when a cancel was requested for a running job
``simulated``        "1" when the run was simulated (no GPU), else absent
``user``, ``team``   who submitted it (the spec's, ``user`` defaulting to the submitting OS
                     user); plain strings, for filters and accounting
``deps``             json: the spec's ``depends_on`` (absent without dependencies)
``deps_left``        int, parents that have not succeeded yet
``hold``             "1" while a user holds the job (``snugfit hold``)
``requeue``          "1" when ``snugfit requeue`` asked a running job's worker to stop it
``deployment``       a serving replica's deployment id (``P:deploy:{id}``), else absent
``engine``           json: a serving replica's engine values (names in
                     ``predictor.serving.ENGINE_PLACEHOLDERS``), copied into its placement
                     and RQ ``job.meta`` for the command's placeholders; else absent

Allocation (``P:allocs`` values, json)
======================================

``{"attempt": int, "kind": 0|1|2, "gpus": [int], "used_mib": int, "reserved_mib": int,
"mig_mask": int, "option": Option.to_dict()}``: ``used_mib`` is taken from each GPU (a whole
GPU's capacity, a MIG slice's memory, or a shared reservation).

Event (``P:events`` field ``e`` and the JSON-lines placement log, one object per line)
======================================================================================

``{"ts": float, "event": "placed"|"started"|"finished"|"oom"|"requeued"|"reclaimed"|"rejected"|
"cancelled"|"invalid"|"held"|"released"|"dependency_failed", "job_id": str|null,
"attempt": int|null, "node": str|null, "option": Option dict|null, "cost_usd": float|null,
"runner_up": Option dict|null, "reason": str, "policy": str|null,
"outcome": OutcomeRecord dict|null, "simulated": bool}``.
``invalid`` is a hostile or malformed payload found in Redis (no valid job behind it).
An ``oom`` event whose retry was re-split also has ``"retry_layout": {"tensor_parallel":
[from, to], "n_gpus": [from, to]}``.
``held``, ``released``, ``dependency_failed`` and a user's ``requeued`` are written by the Lua
scripts that move the state (``scripts/workflow.lua``), so they reach the stream only, not the
JSON-lines file. Who ran a job (``user``, ``team``) is read from its record, not the event.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ACTIVE_STATES",
    "DEFAULT_PREFIX",
    "EVENTS_MAXLEN",
    "EVENT_KINDS",
    "JOB_FUNCTION",
    "LOG_CAP_BYTES",
    "TERMINAL_STATES",
    "JobState",
    "Keys",
    "queue_name",
    "rq_job_id",
]


DEFAULT_PREFIX = "snugfit"


#: The only function a snugfit worker runs; anything else found in a queue is refused.
JOB_FUNCTION = "workers.execute.run_job"


#: Captured stdout+stderr kept per job (the tail), bytes.
LOG_CAP_BYTES = 1 << 20


#: Events kept in the stream (approximate trimming).
EVENTS_MAXLEN = 1_000_000


class JobState(StrEnum):
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "rejected"})


ACTIVE_STATES: frozenset[str] = frozenset({"pending", "placed", "running"})


EVENT_KINDS: tuple[str, ...] = (
    "placed",
    "started",
    "finished",
    "oom",
    "requeued",
    "reclaimed",
    "rejected",
    "cancelled",
    "invalid",
    "held",
    "released",
    "dependency_failed",
    "retrain",
)


def queue_name(node: str) -> str:
    """The RQ queue name of a node (RQ stores it under ``rq:queue:<name>``)."""
    return f"snugfit:node:{node}"


def rq_job_id(job_id: str, attempt: int) -> str:
    """RQ job id of one attempt (re-enqueueing the same attempt is idempotent).

    RQ only accepts ``[A-Za-z0-9_-]``: other characters become ``_`` and a short hash of the
    real id keeps sanitised ids distinct.
    """
    if _RQ_ID_OK.fullmatch(job_id) and len(job_id) <= 180:
        return f"{job_id}-a{attempt}"
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return f"{_RQ_ID_BAD.sub('_', job_id)[:160]}-{digest}-a{attempt}"


_RQ_ID_OK = re.compile(r"[A-Za-z0-9_-]+")


_RQ_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix (tests and several clusters can share a server)."""

    prefix: str = DEFAULT_PREFIX

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def state(self, state: str) -> str:
        return f"{self.prefix}:state:{state}"

    def logs(self, job_id: str) -> str:
        return f"{self.prefix}:logs:{job_id}"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}:job:"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def pending(self) -> str:
        return f"{self.prefix}:pending"

    @property
    def wakeup(self) -> str:
        return f"{self.prefix}:wakeup"

    @property
    def leader(self) -> str:
        return f"{self.prefix}:leader"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def pool(self) -> str:
        return f"{self.prefix}:pool"

    @property
    def gpu(self) -> str:
        return f"{self.prefix}:gpu"

    @property
    def allocs(self) -> str:
        return f"{self.prefix}:allocs"

    @property
    def capver(self) -> str:
        return f"{self.prefix}:capver"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def history(self) -> str:
        return f"{self.prefix}:history"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def deploy(self, deployment_id: str) -> str:
        return f"{self.prefix}:deploy:{deployment_id}"

    @property
    def deploys(self) -> str:
        return f"{self.prefix}:deploys"

    @property
    def deploy_expiry(self) -> str:
        return f"{self.prefix}:deploy_expiry"

    @property
    def node_admin(self) -> str:
        return f"{self.prefix}:node_admin"

    def all_states(self) -> list[str]:
        return [self.state(s.value) for s in JobState]
