"""``snugfit doctor``: what Redis deployment this process sees, and where it breaks a guarantee.

It reports the topology (master, replicas, and the sentinels when ``SNUGFIT_REDIS_URL`` is a
``redis+sentinel://`` URL), the persistence and eviction settings, the ACL user, the durability
mode and the RQ queues with their workers. Each warning names the setting and the fix.
"""

from __future__ import annotations

import os
from typing import Any

import click

from scheduler.cli._options import redis_option
from scheduler.cli.output import dumps_json

__all__ = ["command", "diagnose"]


def _warnings(cfg: dict[str, str], replicas: list[dict[str, Any]], durability: int) -> list[str]:
    out: list[str] = []
    if cfg.get("appendonly") != "yes":
        out.append(
            "appendonly is 'no': a Redis restart loses every write since the last RDB snapshot, "
            "acknowledged jobs included; set `appendonly yes`"
        )
    elif cfg.get("appendfsync") == "no":
        out.append(
            "appendfsync is 'no': the OS decides when the AOF reaches disk (up to ~30 s lost on a "
            "crash); set `appendfsync everysec` (loses ~1 s) or `always`"
        )
    policy = cfg.get("maxmemory-policy", "")
    if policy and policy != "noeviction":
        out.append(
            f"maxmemory-policy is {policy!r}: Redis may evict job records, leases and capacity "
            "under memory pressure; set `maxmemory-policy noeviction`"
        )
    if durability and not replicas:
        out.append(
            "SNUGFIT_DURABILITY=replica but the master has no connected replica: every submit "
            "will fail until one connects"
        )
    return out


def _sentinels(url: str) -> list[dict[str, Any]]:
    import redis

    from scheduler.service.store.sentinel import parse_sentinel_url

    spec = parse_sentinel_url(url)
    rows: list[dict[str, Any]] = []
    for host, port in spec.sentinels:
        kw: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
        if "sentinel_password" in spec.options:
            kw["password"] = spec.options["sentinel_password"]
        if "sentinel_username" in spec.options:
            kw["username"] = spec.options["sentinel_username"]
        row: dict[str, Any] = {"address": f"{host}:{port}"}
        try:
            s = redis.Redis(host=host, port=port, ssl=spec.ssl, **kw)
            m: Any = s.sentinel_master(spec.service)
            row.update(
                up=True,
                master=f"{m['ip']}:{m['port']}",
                flags=m.get("flags"),
                quorum=int(m.get("quorum", 0)),
                other_sentinels=int(m.get("num-other-sentinels", 0)),
                replicas=int(m.get("num-slaves", 0)),
            )
            s.close()
        except (redis.RedisError, OSError) as exc:
            row.update(up=False, error=str(exc))
        rows.append(row)
    return rows


def diagnose(url: str | None = None) -> dict[str, Any]:
    """The report as a dict (what ``--json`` prints)."""
    import redis
    from rq import Queue, Worker

    from scheduler.service.store.durability import Durability
    from scheduler.service.store.embedded import ENV_URL, _redact, connect
    from scheduler.service.store.sentinel import is_sentinel_url

    url = url or os.environ.get(ENV_URL)
    r = connect(url)
    info = r.info("replication")
    replicas = [
        {"address": f"{v['ip']}:{v['port']}", "state": v.get("state"), "lag_s": v.get("lag")}
        for k, v in info.items()
        if k.startswith("slave") and isinstance(v, dict)
    ]
    cfg: dict[str, str] = {}
    for key in (
        "appendonly",
        "appendfsync",
        "maxmemory",
        "maxmemory-policy",
        "min-replicas-to-write",
    ):
        try:
            cfg.update({str(k): str(v) for k, v in r.config_get(key).items()})
        except redis.ResponseError:
            cfg[key] = "unknown (CONFIG GET refused to this ACL user)"
    try:
        user = str(r.acl_whoami())
    except redis.ResponseError:
        user = "default"
    pool = r.connection_pool
    master = getattr(pool, "master_address", None) or (
        pool.connection_kwargs.get("host"),
        pool.connection_kwargs.get("port"),
    )
    durability = Durability.from_env()
    queues = []
    for q in Queue.all(connection=r):
        workers = Worker.all(queue=q)
        queues.append(
            {
                "name": q.name,
                "jobs": q.count,
                "workers": [{"name": w.name, "state": str(w.get_state())} for w in workers],
            }
        )
    out: dict[str, Any] = {
        "url": _redact(url) if url else "embedded",
        "master": {"address": f"{master[0]}:{master[1]}", "role": info.get("role")},
        "replicas": replicas,
        "sentinels": _sentinels(url) if url and is_sentinel_url(url) else [],
        "config": cfg,
        "acl_user": user,
        "durability": "replica" if durability.replicas else "local",
        "rq_queues": queues,
    }
    out["warnings"] = _warnings(cfg, replicas, durability.replicas)
    r.close()
    return out


def _render(d: dict[str, Any]) -> str:
    lines = [
        f"Redis        {d['url']}",
        f"master       {d['master']['address']} ({d['master']['role']})",
    ]
    for rep in d["replicas"] or [{"address": "none", "state": "", "lag_s": ""}]:
        lines.append(
            f"replica      {rep['address']} {rep['state'] or ''} lag {rep['lag_s']} s".rstrip()
        )
    for s in d["sentinels"]:
        if s["up"]:
            lines.append(
                f"sentinel     {s['address']} sees master {s['master']} ({s['flags']}), quorum "
                f"{s['quorum']}, {s['other_sentinels']} other sentinels, {s['replicas']} replicas"
            )
        else:
            lines.append(f"sentinel     {s['address']} DOWN: {s['error']}")
    c = d["config"]
    lines.append(
        f"persistence  appendonly {c.get('appendonly')}, appendfsync {c.get('appendfsync')}; "
        f"maxmemory {c.get('maxmemory')} policy {c.get('maxmemory-policy')}"
    )
    lines.append(f"acl user     {d['acl_user']}")
    lines.append(f"durability   {d['durability']} (SNUGFIT_DURABILITY)")
    for q in d["rq_queues"]:
        names = ", ".join(f"{w['name']} ({w['state']})" for w in q["workers"]) or "NO WORKER"
        lines.append(f"queue        {q['name']}: {q['jobs']} jobs; workers: {names}")
    for w in d["warnings"]:
        lines.append(f"WARNING      {w}")
    return "\n".join(lines)


@click.command(name="doctor")
@redis_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def command(redis_url: str | None, as_json: bool) -> None:
    """Show the Redis topology, persistence, ACL user and RQ queues, with warnings."""
    from scheduler.exceptions import ServiceError

    try:
        d = diagnose(redis_url)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(dumps_json(d) if as_json else _render(d))
