"""The openb trace through snugfit's own core: the pool built from a node list, the openb
scorers as live policies, and the core replay against the legacy one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from scheduler.cli.simulate import simulate_command
from scheduler.core.loop import SchedulerCore
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import TraceError
from scheduler.policies.registry import PolicyName, get_policy
from scheduler.sim.openb.core_replay import CORE_POLICY, replay_core
from scheduler.sim.openb.pool import MODEL_LABEL, OpenbPool, openb_pool, openb_requests
from scheduler.sim.openb.replay import replay
from scheduler.sim.openb.trace import (
    DEFAULT_NODES_CSV,
    DEFAULT_PODS_CSV,
    OpenbWorkload,
    load_nodes,
    load_pods,
)
from tests.openb_csv import G2_T4_NODES, write_pods

NODES = G2_T4_NODES + "n3,96000,393216,4,V100M32\n"
NODE_SCORERS = [
    PolicyName.FGD_NODE,
    PolicyName.FGD_STRAND,
    PolicyName.LOOKAHEAD,
    PolicyName.BESTFIT_NODE,
    PolicyName.DOTPRODUCT,
    PolicyName.GPUPACKING,
    PolicyName.GPUCLUSTERING,
    PolicyName.RANDOM,
]


def _pods(tmp_path: Path, *rows: str) -> OpenbWorkload:
    """The pods of these CSV rows, as the replay reads them."""
    return load_pods(write_pods(tmp_path, rows))


def _requests(op: OpenbPool, tmp_path: Path, *rows: str) -> list[PlacementRequest]:
    """Placement requests for the pods of these CSV rows on the pool ``op``."""
    return openb_requests(_pods(tmp_path, *rows), op)


def _trace_pods(tmp_path: Path, n: int = 80, seed: int = 1) -> Path:
    """Pods of every shape the trace has: shares, whole GPUs, gangs and CPU-only pods."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        num, milli = [(1, 1000), (1, 1000), (1, 500), (1, 250), (1, 810), (1, 50), (0, 0)][
            int(rng.integers(7))
        ]
        if rng.random() < 0.05:
            num, milli = int(rng.choice([2, 4, 8])), 1000
        cpu = int(rng.choice([1000, 2000, 4000, 8000, 16000]))
        mem = int(rng.choice([2048, 8192, 32768]))
        rows.append(f"p{i},{cpu},{mem},{num},{milli},,LS,Running,0,1,0")
    return write_pods(tmp_path, rows)


@pytest.fixture
def cluster(tmp_path: Path):
    n = tmp_path / "nodes.csv"
    n.write_text(NODES)
    return load_nodes(n)


def test_pool_from_the_node_list_keeps_every_node_resource(cluster) -> None:
    op = openb_pool(cluster)
    pool = op.pool
    assert [n.name for n in pool.nodes] == list(cluster.names)
    assert pool.node_count.tolist() == [8, 8, 2, 4]
    assert pool.node_cpu_milli.tolist() == cluster.cpu_milli.tolist()
    assert pool.node_host_mib.tolist() == cluster.memory_mib.tolist()
    assert {n.mode for n in pool.nodes} == {"shared"}
    assert {n.max_shared_jobs for n in pool.nodes} == {48}
    assert {n.whole_gpus for n in pool.nodes} == {True}
    assert op.models == ("G2", "G2", "T4", "V100M32")
    assert [dict(n.labels) for n in pool.nodes] == [{MODEL_LABEL: m} for m in op.models]


def test_pool_refuses_gpu_less_nodes(tmp_path: Path) -> None:
    n = tmp_path / "nodes.csv"
    n.write_text(NODES + "cpu0,32000,131072,0,\n")
    with pytest.raises(TraceError, match="node 'cpu0' has no GPU"):
        openb_pool(load_nodes(n))


def test_milli_gpu_maps_to_whole_mib_and_fits_exactly(cluster, tmp_path: Path) -> None:
    op = openb_pool(cluster)
    # 470 + 530 = 1000 milli-GPU fit one GPU; 471 more do not.
    reqs = _requests(
        op,
        tmp_path,
        "a,1000,1024,1,470,,LS,Running,0,1,0",
        "b,1000,1024,1,530,,LS,Running,0,1,0",
        "c,1000,1024,1,1,,LS,Running,0,1,0",
    )
    cap = int(op.pool.type_capacity_mib[0])
    assert reqs[0].vram_upper_gib[0] * 1024 == 470 * cap // 1000
    state = op.pool.state()
    pol = get_policy(PolicyName.GPUPACKING)
    ds = pol.schedule(reqs[:2], state, 0.0)
    assert [d.state for d in ds] == ["placed", "placed"]
    gpus = {state.option_of(r.job_id).gpu_indices for r in reqs[:2]}
    assert len(gpus) == 1, "gpupacking packs the two shares on one GPU"
    (g,) = next(iter(gpus))
    assert int(state.free_mib[g]) * 1000 // cap == 0
    d = pol.schedule([reqs[2]], state, 0.0)[0]
    assert d.state == "placed" and state.option_of(reqs[2].job_id).gpu_indices != (g,)


def test_gpu_spec_becomes_a_node_selector_on_the_model_label(cluster, tmp_path: Path) -> None:
    reqs = _requests(
        openb_pool(cluster),
        tmp_path,
        "ok,1000,1024,1,500,,LS,Running,0,1,0",
        "cpu,1000,1024,0,0,T4,LS,Running,0,1,0",
        "spec,1000,1024,1,1000,T4|G2,LS,Running,0,1,0",
    )
    # A CPU-only pod uses no GPU, so its gpu_spec constrains nothing (as in the legacy replay).
    assert [r.node_selector for r in reqs] == [None, None, ((MODEL_LABEL, ("G2", "T4")),)]


def test_gpu_spec_pods_land_only_on_their_models(cluster, tmp_path: Path) -> None:
    # Pods that fit only the two G2 nodes, or the T4 and V100M32 ones; six whole V100M32 asks
    # fill the 4-GPU node and then find no other node with that model.
    rows = [f"g{i},1000,1024,1,1000,G2,LS,Running,0,1,0" for i in range(6)]
    rows += [f"t{i},1000,1024,1,500,T4|V100M32,LS,Running,0,1,0" for i in range(6)]
    rows += [f"v{i},1000,1024,1,1000,V100M32,LS,Running,0,1,0" for i in range(6)]
    op = openb_pool(cluster)
    reqs = openb_requests(_pods(tmp_path, *rows), op, ids=[r.split(",")[0] for r in rows])
    for name in ("fgd_node", "bestfit_node", "lookahead"):
        state = op.pool.state()
        ds = get_policy(PolicyName(name)).schedule(reqs, state, 0.0)
        on = {d.job_id: d.chosen_option.node for d in ds if d.state == "placed"}
        assert {on[f"g{i}"] for i in range(6)} <= {"n0", "n1"}, name
        assert {on[f"t{i}"] for i in range(6)} <= {"n2", "n3"}, name
        assert all(on.get(f"v{i}") in (None, "n3") for i in range(6)), name
        lost = [d for d in ds if d.state != "placed"]
        assert lost and all(d.job_id.startswith("v") for d in lost), name


def test_gpuspec_replay_through_the_core_matches_the_legacy_replay(cluster, tmp_path) -> None:
    # The trace's pod shapes, a third of them constrained to one or two models.
    rng = np.random.default_rng(3)
    specs = ["G2", "T4", "V100M32", "G2|T4", "T4|V100M32", "G2|V100M32"]
    lines = _trace_pods(tmp_path, n=90, seed=4).read_text().splitlines()[1:]
    rows = []
    for line in lines:
        f = line.split(",")
        if rng.random() < 0.33:
            f[5] = str(rng.choice(specs))
        rows.append(",".join(f))
    pods = _pods(tmp_path, *rows)
    assert sum(bool(s) for s in pods.gpu_spec) > 20
    for policy in ("fgd", "bestfit", "lookahead"):
        old = replay(cluster, pods, policy, seed=7)
        new = replay_core(cluster, pods, policy, seed=7)
        assert new.n_failed == old.n_failed > 0, policy
        assert np.array_equal(new.placed_node, old.placed_node), policy
        assert np.array_equal(new.allocated_pct, old.allocated_pct), policy


def test_cpu_only_and_multi_gpu_pods_take_what_they_ask(cluster, tmp_path: Path) -> None:
    op = openb_pool(cluster)
    pods = _pods(
        tmp_path,
        "share,4000,1024,1,500,,LS,Running,0,1,0",
        "cpu,30000,65536,0,0,,LS,Running,0,1,0",
        "gang,8000,8192,8,1000,,LS,Running,0,1,0",
    )
    reqs = openb_requests(pods, op)
    state = op.pool.state()
    ds = get_policy(PolicyName.FGD_NODE, seed=0).schedule(reqs, state, 0.0)
    assert [d.state for d in ds] == ["placed"] * 3
    share, cpu, gang = (state.option_of(r.job_id) for r in reqs)
    assert share.kind == "shared" and gang.kind == "whole" and gang.n_gpus == 8
    # The CPU-only pod holds a 0 MiB slot: CPUs and memory, no GPU capacity.
    assert cpu.kind == "shared" and cpu.reserved_gib == 0 and cpu.cpus == 30
    k = [n.name for n in op.pool.nodes].index(cpu.node)
    assert int(state.node_cpu_milli[k]) >= 30000
    assert int(state.used_mib[cpu.gpu_indices[0]]) == int(state.reserved_mib[cpu.gpu_indices[0]])
    state.assert_consistent()
    # Gangs take whole idle nodes only: as many more fit as 8-GPU nodes are still all idle.
    idle = ~state.busy & (state.used_mib == 0)
    free_nodes = sum(
        1 for n in op.pool.nodes if n.count == 8 and idle[n.first_gpu : n.first_gpu + 8].all()
    )
    more = openb_requests(pods.take(np.full(free_nodes + 1, 2)), op, ids=None)
    more = [replace(r, job_id=f"gang-{i}") for i, r in enumerate(more)]
    states = [d.state for d in get_policy(PolicyName.FGD_NODE).schedule(more, state, 0.0)]
    assert states == ["placed"] * free_nodes + ["pending"]


@pytest.mark.parametrize("name", NODE_SCORERS)
def test_each_scorer_runs_as_a_live_policy_in_the_core(name, cluster, tmp_path) -> None:
    op = openb_pool(cluster)
    reqs = openb_requests(load_pods(_trace_pods(tmp_path, 40)), op)
    # No target workload given: FGD and FGD-strand read it from the queue, as live.
    core = SchedulerCore(op.pool.state(), get_policy(name, seed=3))
    for r in reqs:
        core.submit(r)
    decisions = core.tick(0.0)
    assert len(decisions) == len(reqs)
    placed = [d for d in decisions if d.state == "placed"]
    assert len(placed) > 15
    core.state.assert_consistent()
    free_cpu = op.pool.node_cpu_milli - core.state.node_cpu_milli
    assert (free_cpu >= 0).all() and (core.state.used_mib <= op.pool.capacity_mib).all()
    for d in placed:
        assert d.reason.startswith("highest ") and d.chosen_option is not None
        assert d.chosen_option.node in cluster.names


def test_bestfit_node_takes_the_node_with_least_cpu_and_gpu_left(cluster, tmp_path) -> None:
    op = openb_pool(cluster)
    reqs = _requests(
        op,
        tmp_path,
        "big,30000,1024,1,1000,,LS,Running,0,1,0",
        "next,1000,1024,1,1000,,LS,Running,0,1,0",
    )
    state = op.pool.state()
    ds = get_policy(PolicyName.BESTFIT_NODE).schedule(reqs, state, 0.0)
    # The 2-GPU, 32-core node is the tightest fit for both.
    assert [d.chosen_option.node for d in ds if d.chosen_option] == ["n2", "n2"]


@pytest.mark.parametrize("policy", sorted(set(CORE_POLICY) - {"rightsize"}))
def test_short_replay_places_every_pod_as_the_legacy_replay(policy, cluster, tmp_path) -> None:
    pods = load_pods(_trace_pods(tmp_path))
    old = replay(cluster, pods, policy, seed=5)
    new = replay_core(cluster, pods, policy, seed=5)
    assert new.n_pods == old.n_pods > 0
    assert np.array_equal(new.placed_node, old.placed_node)
    assert np.array_equal(new.allocated_pct, old.allocated_pct)
    assert new.extras["registry_policy"] == CORE_POLICY[policy].value


def _cli(args: list[str]) -> dict:
    res = CliRunner().invoke(simulate_command, ["openb", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_simulate_openb_rightsize_runs_through_the_core(cluster, tmp_path) -> None:
    nodes = tmp_path / "nodes.csv"
    pods = _trace_pods(tmp_path)
    out = _cli(
        ["--nodes", str(nodes), "--pods", str(pods), "--policy", "rightsize", "--seeds", "2"]
    )
    assert out["engine"] == "core" and out["registry_policy"] == "lookahead"
    assert out["simulated"] is True and out["seeds"] == [42, 43]
    ours = _cli(
        ["--nodes", str(nodes), "--pods", str(pods), "--policy", "lookahead", "--seeds", "2"]
    )
    assert out["unallocated_gpu_pct_per_seed"] == ours["unallocated_gpu_pct_per_seed"]


def test_simulate_openb_says_which_engine_ran(cluster, tmp_path) -> None:
    nodes = tmp_path / "nodes.csv"
    rows = ["a,1000,1024,1,500,,LS,Running,0,1,0", "b,2000,1024,1,1000,G2,LS,Running,0,1,0"]
    pods = write_pods(tmp_path, rows, "mixed.csv")
    base = ["--nodes", str(nodes), "--pods", str(pods), "--policy", "rightsize", "--seeds", "1"]
    # A gpu_spec pod goes through the core too (as a node selector).
    auto = _cli(base)
    assert auto["engine"] == "core" and auto["registry_policy"] == "lookahead"
    legacy = _cli([*base, "--engine", "replay"])
    assert legacy["engine"] == "replay" and legacy["delegated_to"] == "lookahead"
    assert legacy["unallocated_gpu_pct_per_seed"] == auto["unallocated_gpu_pct_per_seed"]


@pytest.mark.slow
@pytest.mark.skipif(not DEFAULT_PODS_CSV.is_file(), reason="openb trace not present")
@pytest.mark.parametrize("policy", ["fgd", "bestfit", "lookahead"])
def test_default_list_through_the_core_matches_the_legacy_replay(policy: str) -> None:
    cluster, pods = load_nodes(DEFAULT_NODES_CSV), load_pods(DEFAULT_PODS_CSV)
    old = replay(cluster, pods, policy, seed=42)
    new = replay_core(cluster, pods, policy, seed=42)
    assert np.array_equal(new.placed_node, old.placed_node)
    assert new.unallocated_gpu_pct_at_end == old.unallocated_gpu_pct_at_end
