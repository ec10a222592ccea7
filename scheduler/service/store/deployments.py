"""Serving deployments in Redis: ``P:deploy:{id}`` hashes, the ``P:deploys`` index and the
``P:deploy_expiry`` schedule (layout in :mod:`scheduler.service.store.keys`).

A deployment's replicas are ordinary job records (``{id}-r{k}``, written with
:meth:`RedisStore.add_jobs`), so their capacity moves only through the job scripts; this store
holds the deployment's own fields, which no capacity depends on.

Deployment hash fields: ``id``, ``state`` (``active`` | ``cancelled`` | ``expired``), ``spec``
(json, the serve JobSpec), ``plan`` (json: the ``snugfit plan`` contract object plus
``reason``, ``engine_flags`` and the pool's GPU types it was planned on), ``chosen`` (index of the
option the replicas run), ``engine`` (json, the placeholder values), ``replicas`` (the target
count), ``request_rate``, ``next_replica`` (replicas ever created: their ids are ``-r0`` ..),
``created_at``, ``expires_at`` (absent: until cancelled), ``updated_at``, ``reason``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.service.store.keys import Keys

__all__ = ["DeploymentStore", "replica_id"]


def replica_id(deployment_id: str, k: int) -> str:
    return f"{deployment_id}-r{k}"


class DeploymentStore:
    """Reads and writes of deployment records on the Redis client of a ``RedisStore``."""

    def __init__(self, store: Any) -> None:
        self.r: Any = store.r
        self.keys: Keys = store.keys

    def create(
        self, deployment_id: str, fields: Mapping[str, str], expires_at: float | None
    ) -> bool:
        """Write a new deployment; False (and nothing written) when the id exists."""
        key = self.keys.deploy(deployment_id)
        if not self.r.hsetnx(key, "id", deployment_id):
            return False
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping=dict(fields))
        pipe.zadd(self.keys.deploys, {deployment_id: float(fields["created_at"])})
        if expires_at is not None:
            pipe.zadd(self.keys.deploy_expiry, {deployment_id: expires_at})
        pipe.execute()
        return True

    def get(self, deployment_id: str) -> dict[str, str] | None:
        data: dict[str, str] = self.r.hgetall(self.keys.deploy(deployment_id))
        return data or None

    def exists(self, deployment_id: str) -> bool:
        return bool(self.r.exists(self.keys.deploy(deployment_id)))

    def ids(self) -> list[str]:
        return list(self.r.zrange(self.keys.deploys, 0, -1))

    def set_fields(self, deployment_id: str, values: Mapping[str, str]) -> None:
        self.r.hset(self.keys.deploy(deployment_id), mapping=dict(values))

    def take_replica_indices(self, deployment_id: str, n: int) -> range:
        """Reserve ``n`` fresh replica indices (atomic: two scalers never reuse an id)."""
        end = int(self.r.hincrby(self.keys.deploy(deployment_id), "next_replica", n))
        return range(end - n, end)

    def replica_ids(self, deployment_id: str) -> list[str]:
        n = int(self.r.hget(self.keys.deploy(deployment_id), "next_replica") or 0)
        return [replica_id(deployment_id, k) for k in range(n)]

    def due(self, now: float, limit: int = 100) -> list[str]:
        """Active deployments whose ``duration_s`` ran out by ``now``."""
        return list(self.r.zrangebyscore(self.keys.deploy_expiry, "-inf", now, start=0, num=limit))

    def claim_expiry(self, deployment_id: str) -> bool:
        """Take a deployment off the expiry schedule; True for exactly one caller."""
        return bool(self.r.zrem(self.keys.deploy_expiry, deployment_id))
