"""Per-user and per-team Prometheus series with bounded label cardinality.

A label value is kept as itself for the first ``max_users`` users (``max_teams`` teams) the
service sees; every later one is counted under ``other``, so a cluster with thousands of
users still exports at most ``(max_users + 1) x (max_teams + 1)`` series per metric (51 x 21
by default). Jobs without a team count under ``-``. Figures follow
:mod:`scheduler.service.accounting`: GPU-hours and cost are measured (runtime x the option's
GPU share and price per second), counted when an attempt ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter

__all__ = ["DEFAULT_MAX_TEAMS", "DEFAULT_MAX_USERS", "BoundedLabel", "UserMetrics"]

DEFAULT_MAX_USERS = 50
DEFAULT_MAX_TEAMS = 20
OTHER = "other"
NONE = "-"
_MAX_REMEMBERED = 200_000


class BoundedLabel:
    """The first ``limit`` distinct values map to themselves, the rest to ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return NONE
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER


class UserMetrics:
    """``snugfit_user_placements_total``, ``snugfit_user_gpu_hours_total`` and
    ``snugfit_user_cost_usd_total``, each labelled ``user`` and ``team``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_users: int = DEFAULT_MAX_USERS,
        max_teams: int = DEFAULT_MAX_TEAMS,
    ) -> None:
        self.user_label = BoundedLabel(max_users)
        self.team_label = BoundedLabel(max_teams)
        labels = ["user", "team"]
        self.placements = Counter(
            "snugfit_user_placements",
            "Attempts placed, by user and team (bounded: later names count as `other`).",
            labels,
            registry=registry,
        )
        self.gpu_hours = Counter(
            "snugfit_user_gpu_hours",
            "Measured GPU-hours of ended attempts (a MIG slice or MPS share as its fraction).",
            labels,
            registry=registry,
        )
        self.cost = Counter(
            "snugfit_user_cost_usd",
            "Measured cost of ended attempts: the option's price per second x runtime.",
            labels,
            registry=registry,
        )
        # (job, attempt) -> (labels, placed event) until the attempt ends.
        self._open: OrderedDict[tuple[str, int], tuple[tuple[str, str], dict[str, Any]]] = (
            OrderedDict()
        )

    def placed(
        self, key: tuple[str, int], user: str | None, team: str | None, ev: Mapping[str, Any]
    ) -> None:
        labels = (self.user_label(user), self.team_label(team))
        self.placements.labels(*labels).inc()
        self._open[key] = (labels, dict(ev))
        if len(self._open) > _MAX_REMEMBERED:
            self._open.popitem(last=False)

    def ended(self, key: tuple[str, int], ev: Mapping[str, Any]) -> None:
        from scheduler.service.accounting import charge_attempt

        got = self._open.pop(key, None)
        if got is None or not isinstance(ev.get("outcome"), dict):
            return
        labels, placed = got
        c = charge_attempt(placed, ev)
        self.gpu_hours.labels(*labels).inc(c.gpu_hours)
        if c.cost_usd is not None and c.cost_usd >= 0:
            self.cost.labels(*labels).inc(c.cost_usd)
