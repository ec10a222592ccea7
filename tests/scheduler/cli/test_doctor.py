"""``snugfit doctor`` on the test Redis: topology, settings with warnings, queues, ``--json``."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from scheduler.cli import cli
from scheduler.cli.doctor import _warnings


def test_doctor_json_reports_master_config_user_and_queues(redis_url: str) -> None:
    from rq import Queue

    Queue("snugfit:node:n1", connection=redis.Redis.from_url(redis_url))
    res = CliRunner().invoke(cli, ["doctor", "--redis", redis_url, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["master"]["role"] == "master" and d["sentinels"] == []
    assert {"appendonly", "maxmemory-policy"} <= set(d["config"])
    assert d["acl_user"] and d["durability"] in {"local", "replica"}
    assert isinstance(d["rq_queues"], list) and isinstance(d["warnings"], list)
    text = CliRunner().invoke(cli, ["doctor", "--redis", redis_url])
    assert text.exit_code == 0 and "persistence  appendonly" in text.output


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({"appendonly": "no", "maxmemory-policy": "noeviction"}, "appendonly yes"),
        ({"appendonly": "yes", "appendfsync": "no", "maxmemory-policy": "noeviction"}, "everysec"),
        ({"appendonly": "yes", "maxmemory-policy": "allkeys-lru"}, "noeviction"),
    ],
)
def test_each_broken_guarantee_is_warned(cfg: dict[str, str], needle: str) -> None:
    assert any(needle in w for w in _warnings(cfg, [{"address": "r"}], 0))


def test_replica_durability_without_replica_is_warned() -> None:
    good = {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}
    assert _warnings(good, [{"address": "r"}], 1) == []
    assert any("no connected replica" in w for w in _warnings(good, [], 1))
