"""`snugfit demo` end to end: real subprocesses, a private Redis, simulated workers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from scheduler.cli.demo.command import demo_command
from scheduler.cli.demo.live import live_metrics
from scheduler.cli.demo.processes import ProcessGroup
from scheduler.cli.demo.run import DemoConfig, run_demo
from scheduler.core.pool import load_pool

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_small_demo_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    cfg = DemoConfig(jobs=20, seed=1, output_dir=out, live=False, target_s=8.0,
                     workers_per_node=1, timeout_s=240.0)  # fmt: skip
    res = run_demo(cfg, console)
    text = console.export_text()
    assert "requested baseline (simulated)" in text and "snugfit live (rightsize)" in text
    assert f"report: {res.report_path}" in text
    # It served the live dashboard while it ran, and stopped it at the end.
    served = re.search(r"live dashboard: http://127\.0\.0\.1:(\d+)/", text)
    assert served is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(served.group(1)))) != 0
    html = res.report_path.read_text()
    assert html.count('class="job"') > 0 and '<svg class="chart cost"' in html
    assert html.count('<svg class="chart frontier"') == 2  # an 8B and a 70B deployment
    summary = json.loads(res.summary_path.read_text())
    assert summary["jobs"] == 20 and summary["baseline"] == "requested"
    terminal = sum(res.states.get(s, 0) for s in ("succeeded", "failed", "rejected", "cancelled"))
    assert terminal == 20
    assert res.live["n_finished"] == res.states.get("succeeded", 0) > 0
    assert res.live["cost_usd"] > 0 and res.baseline["cost_usd"] > 0
    # summary.json keeps its keys; the live block has the simulated blocks' history keys.
    for key in ("jobs_predicted_from_history", "oom_kills_history", "oom_kills_no_history"):
        assert key in summary["live"] and key in summary["simulated"]["rightsize"]
    assert summary["simulated"]["rightsize"]["feedback"] is True
    jobs = [json.loads(ln) for ln in (out / "jobs.jsonl").read_text().splitlines()]
    assert all(j["simulated"] for j in jobs if j.get("state") == "succeeded")
    # Every scheduler/worker process is gone.
    pids = subprocess.run(["pgrep", "-f", str(out / "placement-log.jsonl")],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    assert [p for p in pids if _alive(int(p))] == []


def test_process_group_stops_children_and_grandchildren(tmp_path: Path) -> None:
    group = ProcessGroup()
    script = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"  # noqa: E501
    group.start("sleeper", [sys.executable, "-c", script], os.environ, tmp_path / "log")
    proc = group.procs[0][1]
    time.sleep(0.5)
    kids = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    members = [int(p) for p in kids.stdout.split()]
    assert len(members) >= 2
    group.stop()
    time.sleep(0.2)
    assert not any(_alive(p) for p in members)
    group.stop()  # idempotent


def test_process_group_stops_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    group = ProcessGroup()
    script = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    group.start("stubborn", [sys.executable, "-c", script], os.environ, tmp_path / "log")
    time.sleep(0.3)
    t = time.monotonic()
    group.stop()
    assert group.procs[0][1].returncode == -signal.SIGKILL
    assert time.monotonic() - t < 10


def test_live_metrics_from_events_bills_attempts_and_counts_ooms() -> None:
    pool = load_pool(REPO / "datasets/pools/small.toml")
    opt = {"kind": "whole", "gpu_type": "H100-80GB", "n_gpus": 1, "capacity_gib": 79.6,
           "reserved_gib": 20.0, "vram_gib": 18.0, "runtime_s": 3600.0, "cost_usd": 3.0,
           "gpu_indices": [6], "node": "h100-0", "mig_profile": None}  # fmt: skip
    big = {**opt, "reserved_gib": 30.0}
    ev = [
        {"ts": 100.0, "event": "placed", "job_id": "a", "attempt": 1, "option": opt},
        {"ts": 100.0, "event": "started", "job_id": "a", "attempt": 1},
        {"ts": 100.5, "event": "oom", "job_id": "a", "attempt": 1,
         "outcome": {"peak_vram_gib": 20.0, "oom": True}},
        {"ts": 101.0, "event": "placed", "job_id": "a", "attempt": 2, "option": big},
        {"ts": 101.0, "event": "started", "job_id": "a", "attempt": 2},
        {"ts": 104.6, "event": "finished", "job_id": "a", "attempt": 2,
         "outcome": {"peak_vram_gib": 24.0, "state": "succeeded"}},
    ]  # fmt: skip
    recs = [{"id": "a", "state": "succeeded", "submitted_at": 99.0},
            {"id": "r", "state": "rejected", "submitted_at": 99.5}]  # fmt: skip
    m, attempts = live_metrics(recs, ev, pool, t0=99.0, time_scale=0.001)
    assert len(attempts) == 2 and attempts[0].oom
    assert m["oom_kills"] == 1 and m["n_rejected"] == 1 and m["n_finished"] == 1
    # 500 + 3600 workload seconds on a $3/h option
    assert m["cost_usd"] == pytest.approx(3.0 * 4100 / 3600, rel=1e-6)
    assert m["reserved_over_actual_median"] == pytest.approx(30.0 / 24.0, rel=1e-6)
    assert m["queue_delay_p50_s"] == pytest.approx(1000.0)


def test_demo_command_rejects_bad_options() -> None:
    res = CliRunner().invoke(demo_command, ["--jobs", "0"])
    assert res.exit_code != 0 and "--jobs" in res.output
    res = CliRunner().invoke(demo_command, ["--time-scale", "-1"])
    assert res.exit_code != 0 and "--time-scale" in res.output


@pytest.mark.slow
def test_full_demo_300_jobs(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        demo_command, ["--no-live", "--output-dir", str(tmp_path), "--jobs", "300"]
    )
    assert res.exit_code == 0, res.output
    assert "report:" in res.output and (tmp_path / "report.html").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    live, sim = summary["live"], summary["simulated"]["rightsize"]
    assert live["cost_usd"] < summary["simulated"]["requested"]["cost_usd"]
    # One truth, one set of rules: the live run and its simulation agree.
    assert abs(live["cost_usd"] / sim["cost_usd"] - 1) <= 0.05
    assert min(live["jobs_predicted_from_history"], sim["jobs_predicted_from_history"]) > 0
    ratio = live["jobs_predicted_from_history"] / sim["jobs_predicted_from_history"]
    assert 0.8 <= ratio <= 1.2
