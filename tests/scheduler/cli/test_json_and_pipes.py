"""`--json` on every data command is strict, typed JSON, and piped tables are complete.

The service commands run against a real Redis populated as the scheduler and workers write it
(the scenario of ``test_ops``); CliRunner's stdout is not a terminal, which is exactly the pipe
case: tables default to tab-separated text there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from pydantic import BaseModel

from scheduler.cli import cli
from scheduler.cli.output import dumps_json, resolve_format, to_tsv
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.scheduler.cli.test_ops import Scenario, _write

REPO = Path(__file__).resolve().parents[3]


def _strict(text: str) -> Any:
    """json.loads that refuses NaN / Infinity (not JSON) instead of accepting them."""

    def bad(token: str) -> Any:
        raise AssertionError(f"non-JSON constant {token} in output")

    return json.loads(text, parse_constant=bad)


def _walk(v: Any) -> Iterator[Any]:
    yield v
    if isinstance(v, dict):
        for x in v.values():
            yield from _walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk(x)


def _no_stringly_values(doc: Any) -> None:
    for v in _walk(doc):
        assert v not in ("None", "nan", "NaN", "inf"), f"stringly value {v!r} in JSON"


def _invoke(args: list[str], **kw: Any) -> str:
    got = CliRunner().invoke(cli, args, catch_exceptions=False, **kw)
    assert got.exit_code == 0, got.output
    return got.output


@pytest.fixture
def scenario(redis_url: str) -> Scenario:
    return _write(redis_url)


# ---------------------------------------------------------------------------------------------
# the output rule itself


def test_format_defaults_to_table_on_a_terminal_and_tsv_in_a_pipe() -> None:
    assert resolve_format(None, tty=True) == "table"
    assert resolve_format(None, tty=False) == "tsv"
    assert resolve_format("table", tty=False) == "table"
    assert resolve_format("tsv", True, tty=True) == "json"  # --json wins
    assert resolve_format("json", tty=True) == "json"


def test_dumps_json_writes_null_for_missing_and_non_finite_values() -> None:
    class M(BaseModel):
        x: float | None
        y: float

    doc = _strict(dumps_json({"m": M(x=None, y=math.nan), "inf": math.inf, "p": Path("/a")}))
    assert doc == {"m": {"x": None, "y": None}, "inf": None, "p": "/a"}


def test_tsv_keeps_every_cell_whole() -> None:
    from rich.table import Table
    from rich.text import Text

    t = Table(title="t")
    t.add_column("a")
    t.add_column("why")
    long = "insufficient free H100-80GB: 2 more needed " * 6
    t.add_row("[green]yes[/]", Text(long + "\tand\na newline"))
    lines = to_tsv([Text("head"), t]).splitlines()
    assert lines[0] == "# head" and lines[2] == "# t"
    assert lines[3] == "a\twhy"
    assert lines[4] == "yes\t" + long + " and a newline"  # a tab and a newline: spaces


# ---------------------------------------------------------------------------------------------
# piped tables: nothing truncated


def test_piped_explain_keeps_every_reason_and_cost_whole(scenario: Scenario) -> None:
    out = _invoke(["explain", scenario.pending, "--redis", scenario.url])
    assert "…" not in out
    header = next(ln for ln in out.splitlines() if ln.startswith("\toption\t"))
    cols = header.split("\t")
    assert cols[-1] == "status / why it lost" and "cost" in cols
    rows = [ln.split("\t") for ln in out.splitlines() if ln.count("\t") == len(cols) - 1]
    rows = [r for r in rows if r != cols]
    d = scenario.decisions[scenario.pending]
    assert len(rows) == len(d.options)
    reasons = {o.reason for o in d.options if o.reason}
    assert reasons and reasons <= {r[-1] for r in rows}  # each reason complete, as stored
    costs = [r[cols.index("cost")] for r in rows]
    assert all(c == "-" or (c.startswith("$") and c[-1].isdigit()) for c in costs)


def test_piped_table_format_is_laid_out_at_full_width(scenario: Scenario) -> None:
    out = _invoke(["explain", scenario.pending, "--format", "table", "--redis", scenario.url])
    assert "…" not in out and "┃" in out
    d = scenario.decisions[scenario.pending]
    longest = max((o.reason for o in d.options if o.reason), key=len)
    assert any(longest in ln for ln in out.splitlines())  # on one line, not wrapped


def test_piped_pool_lists_every_gpu_and_price(scenario: Scenario) -> None:
    out = _invoke(["pool", "--redis", scenario.url])
    assert "…" not in out
    lines = out.splitlines()
    start = lines.index("node\tgpu\ttype\tmode\treserved/cap GiB\tused GiB\tjobs / MIG layout")
    gpu_rows = [ln for ln in lines[start + 1 :] if ln and not ln.startswith("#")]
    gpu_rows = gpu_rows[: scenario.pool.n_gpus]
    assert [int(r.split("\t")[1]) for r in gpu_rows] == list(range(scenario.pool.n_gpus))
    assert any(scenario.running in r for r in gpu_rows)
    for node in scenario.pool.nodes:  # every row stands alone: its node and type repeated
        rows = [r.split("\t") for r in gpu_rows if r.split("\t")[0].startswith(node.name)]
        assert len(rows) == node.count and {r[2] for r in rows} == {node.gpu_type}
    free = lines[lines.index("type\tGPUs\tidle\tfree GiB\tprice $/GPU-h") + 1 :]
    prices = {r.split("\t")[0]: float(r.split("\t")[-1]) for r in free if "\t" in r}
    assert prices == {t: scenario.pool.price_for(t) for t in prices} and prices


# ---------------------------------------------------------------------------------------------
# --json of each command


def test_service_commands_print_typed_json(scenario: Scenario) -> None:
    url = ["--redis", scenario.url]
    job = _strict(_invoke(["status", scenario.finished, "--json", *url]))
    assert job["state"] == "succeeded" and isinstance(job["attempt"], int)
    assert isinstance(job["submitted_at"], float) and isinstance(job["finished_at"], float)
    assert isinstance(job["outcome"]["peak_vram_gib"], float)
    assert job["decision"]["options"] and all(o is not None for o in job["decision"]["options"])
    _no_stringly_values(job)
    counts = _strict(_invoke(["status", "--json", "--state", "pending", *url]))
    assert all(isinstance(v, int) for v in counts["counts"].values())
    assert scenario.pending in counts["jobs"]
    exp = _strict(_invoke(["explain", scenario.running, "--json", *url]))
    assert exp["placement"]["attempt"] == 1 and exp["cancel_requested"] is False
    _no_stringly_values(exp)
    pool = _strict(_invoke(["pool", "--json", *url]))
    assert isinstance(pool["free_by_type"]["B200-180GB"]["free_gib"], float)
    events = [_strict(ln) for ln in _invoke(["log", "--json", *url]).splitlines()]
    assert all(isinstance(e["ts"], float) for e in events)
    logs = _strict(_invoke(["logs", scenario.finished, "--json", *url]))
    assert logs == {"id": scenario.finished, "state": "succeeded", "attempt": 1, "text": ""}
    node = _strict(_invoke(["node", "cordon", "b200-0", "--json", *url]))
    assert node == {"node": "b200-0", "action": "cordon", "admin_state": "cordoned"}
    cancel = _strict(_invoke(["cancel", scenario.pending, "--json", *url]))
    assert cancel == {"id": scenario.pending, "result": "cancelled"}
    again = _strict(_invoke(["cancel", scenario.finished, "--json", *url]))
    assert again == {"id": scenario.finished, "result": "succeeded"}


def test_submit_logs_and_doctor_json(redis_url: str, tmp_path: Path) -> None:
    f = tmp_path / "job.jsonl"
    f.write_text(json.dumps(spec(0)) + "\n")
    assert _strict(_invoke(["submit", str(f), "--json", "--redis", redis_url])) == ["job-0"]
    store = RedisStore(redis.Redis.from_url(redis_url))
    pool = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB"}]})
    SchedulerService(store, pool).step()
    store.set_logs("job-0", "hello\n")
    logs = _strict(_invoke(["logs", "job-0", "--json", "--redis", redis_url]))
    assert logs == {"id": "job-0", "state": "placed", "attempt": 1, "text": "hello\n"}
    assert Client(store=store).get("job-0").status() == "placed"
    doc = _strict(_invoke(["doctor", "--json", "--redis", redis_url]))
    assert isinstance(doc["rq_queues"][0]["jobs"], int) and isinstance(doc["warnings"], list)


def test_offline_commands_print_typed_json(tmp_path: Path) -> None:
    gpus = _strict(_invoke(["gpus", "--json"]))
    h200 = next(g for g in gpus if g["name"] == "H200-141GB")
    assert isinstance(h200["memory_gib"], float | int) and h200["peak_tflops"]["bf16"] > 0
    assert all(isinstance(p["placements"], list) for p in h200["mig_profiles"])
    models = _strict(_invoke(["models", "--json"]))
    assert "llama-3.1-8b" in models
    sim = _strict(_invoke(["simulate", "workload", "--pool", "small", "--days", "0.02",
                           "--policy", "rightsize", "--json"]))  # fmt: skip
    assert isinstance(sim["results"][0]["cost_usd"], float | int)
    _no_stringly_values(sim)
    serve = tmp_path / "serve.yaml"
    serve.write_text(
        "id: chat\nmodel: llama-3.1-8b\ntask: serve\nrequest_rate: 2.0\nslo_ttft_s: 0.5\n"
        "slo_tpot_s: 0.05\n"
    )
    plan = _strict(_invoke(["plan", "--input", str(serve), "--gpu", "H100-80GB", "--json"]))
    assert plan["id"] == "chat" and isinstance(plan["options"][0]["usd_per_hour"], float)


def test_commands_that_print_data_all_take_json() -> None:
    """The audit, kept: every command that prints data has --json (those that only run a
    service or write files are listed with the reason)."""
    import click

    # The demo writes summary.json; the dashboard serves its data as JSON under /api.
    runs_a_service = {"scheduler", "worker", "demo", "dashboard"}
    ctx = click.Context(cli)
    missing = []
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        subs = list(cmd.commands.values()) if isinstance(cmd, click.Group) else [cmd]
        for sub in subs:
            opts = {o for p in sub.params for o in getattr(p, "opts", [])}
            if name not in runs_a_service and "--json" not in opts:
                missing.append(f"{name} {sub.name}")
    assert missing == []
