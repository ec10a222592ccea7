"""``SNUGFIT_DURABILITY``: when a submission counts as acknowledged.

- ``local`` (the default): when the master has applied it. With AOF ``appendfsync everysec`` a
  crash of the master loses at most about the last second of writes, and a Sentinel failover
  loses whatever the replica had not received yet (asynchronous replication).
- ``replica``: ``submit`` also runs ``WAIT 1 <timeout_ms>`` on the connection that wrote the
  records and returns only when at least one replica holds them, so a failover loses none of what
  was acknowledged. The price is one more round trip (the replication lag) per submit chunk. If no
  replica confirms within ``SNUGFIT_DURABILITY_TIMEOUT_MS`` (default 2000), submit raises
  :class:`NotDurableError` and the jobs count as not submitted. Their records may still exist on
  the master; re-submitting with the same ids is idempotent (the add script keeps an existing
  record and the WAIT is repeated), so the fix is to retry with the ids the error names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from scheduler.exceptions import ServiceError

__all__ = ["ENV_DURABILITY", "ENV_DURABILITY_TIMEOUT", "Durability", "NotDurableError"]

ENV_DURABILITY = "SNUGFIT_DURABILITY"
ENV_DURABILITY_TIMEOUT = "SNUGFIT_DURABILITY_TIMEOUT_MS"

_MODES = ("local", "replica")


class NotDurableError(ServiceError):
    """No replica confirmed a submission in time; the jobs it names count as not submitted."""

    def __init__(self, message: str, job_ids: list[str]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


@dataclass(frozen=True)
class Durability:
    replicas: int = 0
    timeout_ms: int = 2000

    @classmethod
    def from_env(cls) -> Durability:
        mode = (os.environ.get(ENV_DURABILITY) or "local").strip().lower()
        if mode not in _MODES:
            raise ServiceError(f"{ENV_DURABILITY} must be one of {', '.join(_MODES)}; got {mode!r}")
        raw = os.environ.get(ENV_DURABILITY_TIMEOUT) or "2000"
        try:
            timeout_ms = int(raw)
        except ValueError:
            timeout_ms = -1
        if timeout_ms <= 0:
            raise ServiceError(
                f"{ENV_DURABILITY_TIMEOUT} must be a positive integer (milliseconds); got {raw!r}"
            )
        return cls(replicas=1 if mode == "replica" else 0, timeout_ms=timeout_ms)
