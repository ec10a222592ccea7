"""The discrete-event simulator: golden runs, determinism, invariants, OOM requeue, feedback.

Golden runs: key metrics of fixed-seed simulations are stored in ``tests/scheduler/sim/golden/``.
When a deliberate change moves them (the predictor, a policy, the workload mix, the truth
model), regenerate and review the diff::

    SNUGFIT_REGEN_GOLDEN=1 .venv/bin/pytest tests/scheduler/sim/test_simulator.py -k golden
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictor.analytical import predict_table
from predictor.gpus import GPU_NAMES
from scheduler.core.decision import Decision
from scheduler.core.loop import SchedulerCore
from scheduler.core.pool import Pool, load_pool
from scheduler.core.rules import OOM_GROWTH
from scheduler.policies.registry import get_policy
from scheduler.sim.simulator import Simulator, simulate
from scheduler.sim.truth import ResidualModel
from scheduler.sim.workload import Workload, generate_workload

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("SNUGFIT_REGEN_GOLDEN") == "1"
MIXED = REPO / "datasets" / "pools" / "mixed.toml"
# Wall-clock figures differ run to run; everything else must match exactly.
_TIMED = {"wall_s", "placements_per_s"}
SHARED_ONLY = {
    "nodes": [{"name": "s", "gpu": "H100-80GB", "count": 4, "mode": "shared", "max_shared_jobs": 4}]
}


def _constant_residuals(vram_factor: float, runtime_factor: float = 1.0) -> ResidualModel:
    levels = np.array([0.0, 1.0])
    return ResidualModel(
        levels,
        np.full(2, math.log(vram_factor)),
        np.full(2, math.log(runtime_factor)),
        {"source": "test constant"},
    )


def _small_workload(seed: int, days: float = 0.5, **kw: Any) -> Workload:
    return generate_workload(days, seed, jobs_per_day=240, **kw)


def _key_metrics(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in _TIMED}


# -- golden runs --------------------------------------------------------------------------------

GOLDEN_CASES = [
    ("rightsize", 0, True),
    ("requested", 0, True),
    ("fgd", 1, True),
    ("rightsize", 1, False),
]


@pytest.mark.parametrize(("policy", "seed", "feedback"), GOLDEN_CASES)
def test_golden_run(policy: str, seed: int, feedback: bool) -> None:
    pool = load_pool(MIXED)
    wl = _small_workload(seed)
    got = _key_metrics(simulate(pool, [policy], wl, seed=seed, feedback=feedback)[0].to_dict())
    path = GOLDEN / f"sim_{policy}_seed{seed}_{'fb' if feedback else 'nofb'}.json"
    if REGEN or not path.exists():
        if not REGEN:
            pytest.fail(f"{path.name} is missing; run with SNUGFIT_REGEN_GOLDEN=1 to create it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, float):
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
        else:
            assert got[k] == v, k


def test_same_seed_same_result_and_other_seed_differs() -> None:
    pool = load_pool(MIXED)
    wl = _small_workload(3)
    a = simulate(pool, ["rightsize"], wl, seed=3, feedback=True)[0].to_dict()
    b = simulate(pool, ["rightsize"], wl, seed=3, feedback=True)[0].to_dict()
    c = simulate(pool, ["rightsize"], wl, seed=4, feedback=True)[0].to_dict()
    assert _key_metrics(a) == _key_metrics(b)
    assert _key_metrics(a) != _key_metrics(c)


# -- invariants ---------------------------------------------------------------------------------


def _checked_run(
    pool: Pool, policy: str, wl: Workload, seed: int, **kw: Any
) -> tuple[Simulator, dict[str, Any]]:
    ticks = [0]

    def observe(core: SchedulerCore, decisions: list[Decision], now: float) -> None:
        ticks[0] += 1
        core.state.assert_consistent()  # recomputes every GPU from the allocations
        assert (core.state.used_mib <= pool.capacity_mib).all(), "over-committed GPU"
        assert set(core.running) == set(core.state.jobs)

    sim = Simulator(
        pool,
        get_policy(policy),
        wl,
        predict_table(list(wl.specs)),
        seed=seed,
        observer=observe,
        **kw,
    )
    out = sim.run().to_dict()
    assert ticks[0] > 0
    # Every reservation is at least the upper bound the job was predicted with at placement.
    for job_id, reserved, upper in sim.placement_log:
        assert reserved >= upper - 1e-3, (job_id, reserved, upper)
    return sim, out


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["rightsize", "requested", "firstfit", "bestfit", "fgd"]),
    feedback=st.booleans(),
)
def test_invariants_hold_through_a_run(seed: int, policy: str, feedback: bool) -> None:
    pool = load_pool(MIXED)
    wl = generate_workload(0.1, seed, jobs_per_day=300)
    _, out = _checked_run(pool, policy, wl, seed, feedback=feedback, smallest_fit=False)
    assert out["n_finished"] + out["n_rejected"] == out["n_jobs"]


def test_oom_killed_jobs_are_requeued_larger_and_counted() -> None:
    # Every job really uses 1.5x its predicted peak; on shared GPUs the MPS limit is the
    # reservation (predicted x 1.1 + 0.5 GiB), so most first attempts are OOM-killed.
    pool = Pool.from_dict(SHARED_ONLY)
    wl = _small_workload(5, days=0.1, recurrence_share=0.0)
    sim, out = _checked_run(pool, "rightsize", wl, 5, residuals=_constant_residuals(1.5))
    assert out["oom_kills"] > 0
    by_job: dict[str, list[float]] = {}
    for job_id, reserved, _ in sim.placement_log:
        by_job.setdefault(job_id, []).append(reserved)
    kills = {j: sim.jobs[j].oom_kills for j in sim.jobs}
    assert sum(kills.values()) == out["oom_kills"]
    gave_up = set()
    for job_id, res in by_job.items():
        job = sim.jobs[job_id]
        if job.rejected or job.failed:
            # Killed, and the grown reservation fits nowhere in this pool (or the retry cap is
            # reached): the job ends there instead of retrying.
            assert len(res) == kills[job_id]
            gave_up.add(job_id)
        else:
            assert len(res) == kills[job_id] + 1  # each kill is followed by exactly one retry
            assert math.isfinite(job.end_s)  # and the job finished in the end
        for before, after in itertools.pairwise(res):
            assert after >= OOM_GROWTH * before - 1e-3
    assert len(gave_up) < len(by_job)
    # The final reservation of a job that finished holds the true peak.
    for job_id in set(by_job) - gave_up:
        job = sim.jobs[job_id]
        assert job.option is not None
        assert job.true_peak_gib(job.option.gpu_type) <= job.option.reserved_gib + 1e-6


def test_feedback_predicts_reruns_from_history() -> None:
    pool = Pool.from_dict(SHARED_ONLY)
    wl = _small_workload(7, days=0.5, recurrence_share=1.0)
    model = _constant_residuals(1.3)
    _, without = _checked_run(pool, "rightsize", wl, 7, residuals=model, feedback=False)
    _sim, with_fb = _checked_run(pool, "rightsize", wl, 7, residuals=model, feedback=True)
    assert with_fb["jobs_predicted_from_history"] > 0
    # Re-runs reserve from what earlier runs measured, so they stop getting OOM-killed.
    assert with_fb["oom_kills_history"] <= 0.05 * with_fb["jobs_predicted_from_history"]
    assert with_fb["oom_kills"] < without["oom_kills"]
    assert with_fb["reserved_over_actual_median"] <= 1.25


def test_truth_is_consistent_per_fingerprint() -> None:
    pool = load_pool(MIXED)
    wl = _small_workload(2, days=0.5)
    sim = Simulator(pool, get_policy("requested"), wl, predict_table(list(wl.specs)), seed=2)
    by_fp: dict[str, list[float]] = {}
    for fp, job in zip(wl.fingerprint, sim.jobs.values(), strict=True):
        by_fp.setdefault(fp, []).append(math.log(job.vram_factor))
    spreads = [np.std(v) for v in by_fp.values() if len(v) >= 3]
    assert spreads and max(spreads) < 0.1  # run-to-run noise only (sigma 0.02)
    means = [np.mean(v) for v in by_fp.values() if len(v) >= 3]
    assert np.std(means) > 0.03  # while fingerprints differ systematically


def test_oom_is_censored_in_the_history() -> None:
    # Every job uses 1.5x its prediction: the history must learn a floor above the limit each
    # OOM died at, never the true peak (the live worker cannot see it either).
    pool = Pool.from_dict(SHARED_ONLY)
    wl = _small_workload(5, days=0.1, recurrence_share=0.0)
    sim, out = _checked_run(
        pool, "rightsize", wl, 5, residuals=_constant_residuals(1.5), feedback=True
    )
    assert out["oom_kills"] > 0
    floors = [
        x for per in sim.history.predictor._ratios.values() for _, _, f in per.values() for x in f
    ]
    assert floors and all(x < 1.5 for x in floors)  # a limit, below the true 1.5x peak


def test_oom_retry_cap_fails_the_job() -> None:
    # A job that needs 40x its prediction on a shared GPU (limit = reservation) OOMs until the
    # cap, as the live store does: MAX_OOM_RETRIES requeues, then failed. One whose grown
    # reservation no GPU of the pool holds fails at once, as the live worker fails it.
    from scheduler.core.requests import TYPE_INDEX
    from scheduler.core.rules import MAX_OOM_RETRIES, OOM_GROWTH

    pool = Pool.from_dict(SHARED_ONLY)
    wl = _small_workload(5, days=0.05, recurrence_share=0.0)
    sim, _ = _checked_run(pool, "rightsize", wl, 5, residuals=_constant_residuals(40.0))
    failed = [j for j in sim.jobs.values() if j.failed]
    capped = [j for j in failed if j.oom_kills == MAX_OOM_RETRIES + 1]
    assert capped
    h100 = TYPE_INDEX["H100-80GB"]
    for j in failed:
        if j in capped:
            continue
        assert j.oom_kills <= MAX_OOM_RETRIES
        last = float(j.request.reservation_gib()[h100])  # what the last attempt reserved
        assert OOM_GROWTH * last > pool.type_capacity_mib[h100] / 1024  # nothing bigger


def test_tick_interval_batches_scheduling_passes() -> None:
    pool = load_pool(MIXED)
    wl = _small_workload(0)
    table = predict_table(list(wl.specs))
    sims = [
        Simulator(pool, get_policy("rightsize"), wl, table, seed=0, tick_interval_s=dt)
        for dt in (0.0, 300.0)
    ]
    exact, batched = (s.run() for s in sims)
    assert batched.metrics.n_finished == exact.metrics.n_finished
    assert sims[1].core.counters.ticks < sims[0].core.counters.ticks
    # Nobody waits less than with exact ticks, and at most about one interval more at p50.
    assert batched.metrics.queue_delay_p50_s <= exact.metrics.queue_delay_p50_s + 300.0


def test_simulator_runs_multi_node_gangs_and_keeps_every_node_consistent() -> None:
    from predictor.spec import JobSpec

    pool = Pool.from_dict(
        {"nodes": [{"name": f"h{k}", "gpu": "H100-80GB", "count": 8} for k in range(3)]}
    )

    def ft(i: int, n: int) -> JobSpec:
        return JobSpec.model_validate(
            {
                "id": f"ft-{i}",
                "model": "llama-3.1-8b",
                "task": "full_finetune",
                "batch_size": 4,
                "seq_len": 2048,
                "steps": 50,
                "n_gpus": n,
                "tensor_parallel": 8,
            }
        )

    specs = (ft(0, 16), ft(1, 16), ft(2, 8), ft(3, 24))
    wl = Workload(
        specs=specs,
        arrival_s=np.array([0.0, 1.0, 2.0, 3.0]),
        requested_gpu=("H100-80GB",) * 4,
        job_class=("train",) * 4,
        fingerprint=tuple(f"once-{i}" for i in range(4)),
    )
    spans: dict[str, set[int]] = {}

    def observe(core: SchedulerCore, decisions: list[Decision], now: float) -> None:
        core.state.assert_consistent()
        for d in decisions:
            if d.state == "placed" and d.chosen_option is not None:
                spans[d.job_id] = {int(pool.gpu_node[g]) for g in d.chosen_option.gpu_indices}

    sim = Simulator(
        pool, get_policy("rightsize"), wl, predict_table(list(wl.specs)), seed=0, observer=observe
    )
    out = sim.run().to_dict()
    assert out["n_finished"] == 4 and out["n_rejected"] == 0
    # Gangs of 2 and 3 nodes (TP=8 keeps a node's eight GPUs together); the 8-GPU job one node.
    assert len(spans["ft-0"]) == len(spans["ft-1"]) == 2
    assert len(spans["ft-3"]) == 3 and len(spans["ft-2"]) == 1


def test_smallest_fit_rate_is_each_jobs_cheapest_true_fit_or_null_when_not_computed() -> None:
    from scheduler.core.options import option_table
    from scheduler.core.pool import KIND_NAMES
    from scheduler.core.requests import PlacementRequest
    from scheduler.sim import simulator as sim_mod

    pool = load_pool(MIXED)
    wl = _small_workload(3, days=0.5)
    table = predict_table(list(wl.specs))
    sim = Simulator(pool, get_policy("rightsize"), wl, table, seed=3)
    got = sim.run().to_dict()["smallest_fit_rate"]
    # The definition, one option table per finished job on the empty pool (the chunked
    # vectorised enumeration must agree with it).
    empty = pool.state()
    hits = []
    for job in sim.jobs.values():
        if job.option is None or not np.isfinite(job.end_s):
            continue
        assert job.base is not None
        truth = job.base.vram_gib * job.vram_factor
        rt = job.base.runtime_s * job.runtime_factor
        probe = PlacementRequest(
            job.request.job_id,
            truth,
            truth,
            rt,
            rt,
            n_gpus=job.request.n_gpus,
            tensor_parallel=job.request.tensor_parallel,
            gpu=job.request.gpu,
            busy_frac=job.request.busy_frac,
        )
        c = option_table(probe, empty).cheapest(now=False)
        o = job.option
        hits.append(
            c is not None
            and GPU_NAMES[int(pool.class_type[c])] == o.gpu_type
            and KIND_NAMES[int(pool.class_kind[c])] == o.kind
            and pool.class_profile[c] == o.mig_profile
        )
    assert len(hits) > 40 and 0.0 < got < 1.0
    assert got == pytest.approx(round(float(np.mean(hits)), 6))
    # Chunk boundaries do not matter.
    old = sim_mod._SMALLEST_FIT_CHUNK
    try:
        sim_mod._SMALLEST_FIT_CHUNK = 7
        again = Simulator(pool, get_policy("rightsize"), wl, table, seed=3).run().to_dict()
    finally:
        sim_mod._SMALLEST_FIT_CHUNK = old
    assert again["smallest_fit_rate"] == got
    # Not computed is reported as missing, never as 0%.
    off = Simulator(pool, get_policy("rightsize"), wl, table, seed=3, smallest_fit=False)
    assert off.run().to_dict()["smallest_fit_rate"] is None


def test_a_simulated_gang_oom_is_requeued_by_the_single_node_rule_on_a_bigger_type() -> None:
    from predictor.spec import JobSpec

    nodes = [{"name": f"h{k}", "gpu": "H100-80GB", "count": 8} for k in range(2)]
    nodes += [{"name": f"g{k}", "gpu": "H200-141GB", "count": 8} for k in range(2)]
    pool = Pool.from_dict({"nodes": nodes})
    spec = JobSpec.model_validate(
        {
            "id": "ft-gang",
            "model": "llama-3.1-8b",
            "task": "full_finetune",
            "batch_size": 4,
            "seq_len": 2048,
            "steps": 50,
            "n_gpus": 16,
            "tensor_parallel": 8,
        }
    )
    wl = Workload(
        specs=(spec,),
        arrival_s=np.array([0.0]),
        requested_gpu=("H100-80GB",),
        job_class=("train",),
        fingerprint=("once-0",),
    )
    table = predict_table([spec])
    peaks = dict(zip(table.gpu_names, table.peak_vram_gib[0], strict=True))
    # The true peak is 100 GiB per GPU on an H100 (all of its 80 GiB is not enough) and fits
    # an H200.
    factor = 100.0 / float(peaks["H100-80GB"])
    assert float(peaks["H200-141GB"]) * factor < 135.0
    placed: list[tuple[str, int]] = []

    def observe(core: SchedulerCore, decisions: list[Decision], now: float) -> None:
        core.state.assert_consistent()
        for d in decisions:
            if d.state == "placed" and d.chosen_option is not None:
                o = d.chosen_option
                placed.append((o.gpu_type, len({int(pool.gpu_node[g]) for g in o.gpu_indices})))

    sim = Simulator(
        pool,
        get_policy("rightsize"),
        wl,
        table,
        seed=0,
        residuals=_constant_residuals(factor),
        observer=observe,
    )
    out = sim.run().to_dict()
    # Before: the gang failed at once (no single node holds 16 GPUs, so "nothing bigger").
    assert out["n_finished"] == 1 and out["oom_kills"] == 1
    assert placed == [("H100-80GB", 2), ("H200-141GB", 2)]
    assert not sim.jobs["ft-gang"].failed
