"""openb replay on a small synthetic trace, plus one slow run on the real trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.exceptions import TraceError
from scheduler.sim.openb.replay import OpenbPolicy, replay, replay_seeds
from scheduler.sim.openb.trace import (
    DEFAULT_NODES_CSV,
    DEFAULT_PODS_CSV,
    OpenbWorkload,
    load_nodes,
    load_pods,
    tune_workload,
)
from tests.openb_csv import G2_T4_NODES, NODE_HEAD, write_pods

NODES = G2_T4_NODES + "n3,32000,131072,0,\n"


def _pods(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(60):
        kind = rng.integers(4)
        num, milli = [(0, 0), (1, 500), (1, 1000), (2, 1000)][kind]
        rows.append(f"p{i},{int(rng.choice([2000, 4000]))},4096,{num},{milli},,LS,Running,0,1,0")
    return write_pods(tmp_path, rows)


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    n = tmp_path / "nodes.csv"
    n.write_text(NODES)
    return n, _pods(tmp_path)


@pytest.mark.parametrize("policy", [p.value for p in OpenbPolicy])
def test_every_policy_replays_and_never_overcommits(trace, policy: str) -> None:
    nodes, pods = trace
    cluster, workload = load_nodes(nodes), load_pods(pods)
    r = replay(cluster, workload, policy, seed=3)
    assert r.arrived_pct[-1] == pytest.approx(130, abs=100 * 2000 / cluster.gpu_capacity_milli)
    assert np.all(np.diff(r.allocated_pct) >= 0)
    assert np.all(r.allocated_pct <= 100 + 1e-9)
    assert 0 <= r.unallocated_gpu_pct_at_end <= 100


def test_same_seed_same_curve(trace) -> None:
    nodes, pods = trace
    c, w = load_nodes(nodes), load_pods(pods)
    a = replay_seeds(c, w, "fgd", [1, 2])
    b = replay_seeds(c, w, "fgd", [1, 2])
    assert a["allocation_ratio_by_demand"] == b["allocation_ratio_by_demand"]
    assert set(a["allocation_ratio_by_demand"]) == {str(i) for i in range(131)}


def test_bad_inputs_say_what_is_wrong(tmp_path: Path, trace) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_nodes(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,gpu\nx,1\n")
    with pytest.raises(TraceError, match="missing column"):
        load_nodes(bad)
    with pytest.raises(TraceError, match="unknown openb policy"):
        replay(load_nodes(trace[0]), load_pods(trace[1]), "nope", 0)


@pytest.mark.slow
@pytest.mark.skipif(not DEFAULT_PODS_CSV.exists(), reason="openb trace not available")
def test_real_trace_fgd_beats_bestfit() -> None:
    c, w = load_nodes(DEFAULT_NODES_CSV), load_pods(DEFAULT_PODS_CSV)
    fgd = replay(c, w, "fgd", 42).unallocated_gpu_pct_at_end
    bf = replay(c, w, "bestfit", 42).unallocated_gpu_pct_at_end
    ours = replay(c, w, "fgdstrand", 42).unallocated_gpu_pct_at_end
    assert ours < fgd < bf
    assert fgd == pytest.approx(4.61, abs=1.0)


def _workload(milli: list[int], num: list[int] | None = None) -> OpenbWorkload:
    n = len(milli)
    num_gpu = np.array(num if num is not None else [1 if m else 0 for m in milli])
    return OpenbWorkload(
        cpu_milli=np.arange(n, dtype=np.int64),  # the CPU field tags each pod with its index
        memory_mib=np.zeros(n, np.int64),
        num_gpu=num_gpu,
        gpu_milli=np.array(milli, np.int64),
        gpu_spec=tuple(frozenset() for _ in range(n)),
    )


def test_tune_up_keeps_every_trace_pod_first_then_appends_clones() -> None:
    pods = _workload([1000, 500, 0, 250])
    out = tune_workload(pods, capacity_milli=4000, ratio=1.3, rng=np.random.default_rng(0))
    first = out.cpu_milli[: len(pods)]
    assert sorted(first.tolist()) == [0, 1, 2, 3]  # the trace itself, shuffled
    assert out.total_gpu_milli.sum() <= 1.3 * 4000
    # Clones stop before the first that would overshoot the target.
    nxt = min(int(m) for m in pods.gpu_milli if m > 0)
    assert out.total_gpu_milli.sum() + nxt > 1.3 * 4000 - 1000


def test_tune_down_drops_random_pods_until_at_most_the_target() -> None:
    pods = _workload([1000] * 10)
    out = tune_workload(pods, capacity_milli=5000, ratio=1.3, rng=np.random.default_rng(0))
    assert out.total_gpu_milli.sum() == 6000
    assert len(set(out.cpu_milli.tolist())) == 6  # no pod twice


@pytest.mark.parametrize("seed", range(4))
def test_fgdstrand_sends_cpu_only_pods_to_cpu_rich_nodes(tmp_path: Path, seed: int) -> None:
    # A CPU-lean G2-like node (12 CPUs per GPU, exactly what the GPU pods ask) and a CPU-rich
    # T4-like one. A CPU-only pod on the lean node would strand its GPUs, wherever it lands in
    # the arrival order; on the rich node it strands nothing.
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEAD + "lean,96000,393216,8,G2\nrich,104000,524288,2,T4\n")
    rows = [f"g{i},12000,16384,1,1000,,LS,Running,0,1,0" for i in range(13)]  # 130% of 10 GPUs
    rows.append("c0,32000,16384,0,0,,LS,Running,0,1,0")
    pods = write_pods(tmp_path, rows)
    c, w = load_nodes(nodes), load_pods(pods)
    r = replay(c, w, "fgdstrand", seed)
    assert r.n_pods == 14  # the trace is exactly at 130%: no clones
    demand = np.diff(np.concatenate([[0.0], r.arrived_pct]))
    (cpu_only,) = np.flatnonzero(demand == 0)
    assert c.names[int(r.placed_node[cpu_only])] == "rich"


@pytest.mark.parametrize("policy", [p.value for p in OpenbPolicy])
def test_gpu_type_constraint_is_honoured(tmp_path: Path, policy: str) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEAD + "a,64000,262144,2,T4\nb,64000,262144,2,P100\n")
    rows = [f"s{i},1000,1024,1,{m},P100,LS,Running,0,1,0" for i, m in enumerate([500, 1000] * 4)]
    rows += [f"w{i},1000,1024,2,1000,T4,LS,Running,0,1,0" for i in range(2)]
    pods = write_pods(tmp_path, rows)
    c, w = load_nodes(nodes), load_pods(pods)
    r = replay(c, w, policy, seed=1)
    # The tuned workload is the trace plus clones; every placed pod must sit on its own type.
    demand = np.diff(np.concatenate([[0.0], r.arrived_pct])) * c.gpu_capacity_milli / 100
    placed = r.placed_node >= 0
    assert placed.any()
    on = np.array(c.model)[r.placed_node[placed]]
    want = np.where(np.isclose(demand[placed], 2000), "T4", "P100")
    assert (on == want).all()


def test_a_pod_list_is_named_by_its_trace_name_or_given_as_a_path(tmp_path: Path) -> None:
    from scheduler.sim.openb import trace

    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "openb_pod_list_gpuspec05.csv").write_text("name\n")
    mine = tmp_path / "mine.csv"
    mine.write_text("name\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace, "_TRACE_DIR", folder)
        assert trace.pod_list_path("gpuspec05") == folder / "openb_pod_list_gpuspec05.csv"
        assert trace.pod_list_path(str(mine)) == mine
        with pytest.raises(TraceError, match=r"'nope' is neither .* one of: gpuspec05$"):
            trace.pod_list_path("nope")
