"""The Alibaba GPU v2023 "openb" trace: its node and pod lists, and the FGD paper's tuned
workload (the pods shuffled, then re-sampled clones appended up to 130% of GPU capacity).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler.exceptions import TraceError

# The simulator's units and normalisers live with the scorers that use them; re-exported here.
from scheduler.policies._node_scorers import (
    MAX_GPUS_PER_NODE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    MILLI_PER_GPU,
)

__all__ = [
    "DEFAULT_NODES_CSV",
    "DEFAULT_PODS_CSV",
    "MAX_GPUS_PER_NODE",
    "MAX_SPEC_CPU_MILLI",
    "MAX_SPEC_GPU_MILLI",
    "MILLI_PER_GPU",
    "TARGET_DEMAND_RATIO",
    "OpenbCluster",
    "OpenbWorkload",
    "load_nodes",
    "load_pods",
    "pod_list_path",
    "seeded_run",
    "tune_workload",
]


TARGET_DEMAND_RATIO = 1.3


_TRACE_DIR = Path(__file__).resolve().parents[4] / "shared/traces/alibaba-gpu-v2023"


# The paper's runs use the GPU nodes only (the simulator's data/prepare_input.sh copies
# openb_node_list_gpu_node.yaml into every trace folder); the all-node list adds 310 CPU-only
# nodes that CPU-only pods can fill, which moves every policy's figure.
DEFAULT_NODES_CSV = _TRACE_DIR / "openb_node_list_gpu_node.csv"


DEFAULT_PODS_CSV = _TRACE_DIR / "openb_pod_list_default.csv"


def pod_list_path(name: str | Path) -> Path:
    """A pod list by name (``gpuspec05`` -> the trace's ``openb_pod_list_gpuspec05.csv``) or by
    path (an existing file, or anything with a ``/``); TraceError names the lists there are."""
    p = Path(name)
    if p.is_file() or "/" in str(name):
        return p
    named = _TRACE_DIR / f"openb_pod_list_{name}.csv"
    if named.is_file():
        return named
    have = sorted(
        f.stem.removeprefix("openb_pod_list_") for f in _TRACE_DIR.glob("openb_pod_list_*.csv")
    )
    raise TraceError(
        f"--pods {str(name)!r} is neither a file nor a pod list of the trace; use a path or one "
        f"of: {', '.join(have) or f'(no openb_pod_list_*.csv under {_TRACE_DIR})'}"
    )


@dataclass(frozen=True, slots=True)
class OpenbCluster:
    names: tuple[str, ...]
    cpu_milli: np.ndarray  # (N,)
    memory_mib: np.ndarray  # (N,)
    n_gpu: np.ndarray  # (N,)
    model: tuple[str, ...]

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.n_gpu.sum()) * MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class OpenbWorkload:
    cpu_milli: np.ndarray  # (P,)
    memory_mib: np.ndarray  # (P,)
    num_gpu: np.ndarray  # (P,)
    gpu_milli: np.ndarray  # (P,) per GPU; 0 for CPU-only pods
    gpu_spec: tuple[frozenset[str], ...]  # empty = any GPU type

    def __len__(self) -> int:
        return int(self.cpu_milli.shape[0])

    def take(self, idx: np.ndarray) -> OpenbWorkload:
        return OpenbWorkload(
            cpu_milli=self.cpu_milli[idx],
            memory_mib=self.memory_mib[idx],
            num_gpu=self.num_gpu[idx],
            gpu_milli=self.gpu_milli[idx],
            gpu_spec=tuple(self.gpu_spec[int(i)] for i in idx),
        )

    @property
    def total_gpu_milli(self) -> np.ndarray:
        return self.num_gpu * self.gpu_milli


def _read_csv(path: str | Path, required: Sequence[str]) -> list[dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(
            f"trace file {str(p)!r} does not exist; pass --nodes/--pods, or put the openb trace "
            f"under {_TRACE_DIR}"
        )
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{p.name}: missing column(s) {', '.join(missing)}; got {reader.fieldnames}. "
                "Expected the openb CSV layout from alibaba/clusterdata cluster-trace-gpu-v2023"
            )
        return list(reader)


def _int(row: dict[str, str], key: str, where: str) -> int:
    raw = row.get(key, "")
    try:
        return int(float(raw)) if raw.strip() else 0
    except ValueError:
        raise TraceError(f"{where}: `{key}` must be a number, got {raw!r}") from None


def load_nodes(path: str | Path = DEFAULT_NODES_CSV) -> OpenbCluster:
    """Nodes csv: ``sn, cpu_milli, memory_mib, gpu, model``."""
    rows = _read_csv(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    if not rows:
        raise TraceError(f"{Path(path).name}: no nodes")
    n_gpu = np.array([_int(r, "gpu", f"node {r['sn']}") for r in rows], np.int64)
    if (n_gpu > MAX_GPUS_PER_NODE).any() or (n_gpu < 0).any():
        bad = int(n_gpu[(n_gpu > MAX_GPUS_PER_NODE) | (n_gpu < 0)][0])
        raise TraceError(f"node GPU count must be 0..{MAX_GPUS_PER_NODE}, got {bad}")
    return OpenbCluster(
        names=tuple(r["sn"] for r in rows),
        cpu_milli=np.array([_int(r, "cpu_milli", r["sn"]) for r in rows], np.int64),
        memory_mib=np.array([_int(r, "memory_mib", r["sn"]) for r in rows], np.int64),
        n_gpu=n_gpu,
        model=tuple((r.get("model") or "").strip() for r in rows),
    )


def load_pods(path: str | Path = DEFAULT_PODS_CSV) -> OpenbWorkload:
    """Pods csv: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...``."""
    rows = _read_csv(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    if not rows:
        raise TraceError(f"{Path(path).name}: no pods")
    num_gpu = np.array([_int(r, "num_gpu", r["name"]) for r in rows], np.int64)
    gpu_milli = np.array([_int(r, "gpu_milli", r["name"]) for r in rows], np.int64)
    gpu_milli = np.where(num_gpu > 0, gpu_milli, 0)
    if ((num_gpu > 1) & (gpu_milli < MILLI_PER_GPU)).any():
        i = int(np.flatnonzero((num_gpu > 1) & (gpu_milli < MILLI_PER_GPU))[0])
        raise TraceError(
            f"pod {rows[i]['name']}: a multi-GPU pod must request whole GPUs "
            f"(gpu_milli=1000), got num_gpu={num_gpu[i]} gpu_milli={gpu_milli[i]}"
        )
    specs = tuple(
        frozenset(s for s in (r.get("gpu_spec") or "").split("|") if s.strip()) for r in rows
    )
    return OpenbWorkload(
        cpu_milli=np.array([_int(r, "cpu_milli", r["name"]) for r in rows], np.int64),
        memory_mib=np.array([_int(r, "memory_mib", r["name"]) for r in rows], np.int64),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=specs,
    )


def tune_workload(
    pods: OpenbWorkload, capacity_milli: int, ratio: float, rng: np.random.Generator
) -> OpenbWorkload:
    """The trace's pods shuffled, then tuned to ``ratio`` × capacity of GPU demand.

    As the simulator does it (``SortClusterPods`` shuffles before ``TunePodsByNodeTotalResource``
    tunes): a trace below the target keeps every pod, in random order, and clones drawn
    uniformly with replacement follow them at the end; a trace above it loses random pods.
    """
    target = ratio * capacity_milli
    per_pod = pods.total_gpu_milli
    order = rng.permutation(len(pods))
    total = float(per_pod.sum())
    if total > target:
        # tuneDownPods: remove random pods until the demand is at most the target.
        drop = rng.permutation(len(pods))
        cum = total - np.cumsum(per_pod[drop])
        n_drop = int(np.argmax(cum <= target)) + 1
        gone = np.zeros(len(pods), bool)
        gone[drop[:n_drop]] = True
        return pods.take(order[~gone[order]])
    clones: list[int] = []
    while True:
        # tuneUpPods stops at the first clone whose *per-GPU* request would overshoot (the
        # simulator compares `podRes.MilliGpu`, not the total): kept for fidelity, it lets a
        # final multi-GPU clone overshoot by under one node's GPUs.
        draws = rng.integers(0, len(pods), size=512)
        add = per_pod[draws]
        cum_before = total + np.concatenate([[0.0], np.cumsum(add)[:-1]])
        over = np.flatnonzero(cum_before + pods.gpu_milli[draws] > target)
        if over.size:
            clones.extend(draws[: over[0]].tolist())
            break
        clones.extend(draws.tolist())
        total = float(total + add.sum())
    return pods.take(np.concatenate([order, np.asarray(clones, np.int64)]))


def seeded_run(
    cluster: OpenbCluster, pods: OpenbWorkload, seed: int, ratio: float
) -> tuple[np.random.Generator, int, OpenbWorkload, np.ndarray]:
    """One seed's draws in the protocol's order: ``(rng, GPU capacity, tuned workload, node
    order)``; the workload is tuned to ``ratio`` × capacity, then the node order that breaks
    ties is drawn, and ``rng`` goes on to feed the Random scorer."""
    capacity = cluster.gpu_capacity_milli
    if capacity <= 0:
        raise TraceError("the node list has no GPUs; use a node csv with a non-zero `gpu` column")
    rng = np.random.default_rng(seed)
    workload = tune_workload(pods, capacity, ratio, rng)
    return rng, capacity, workload, rng.permutation(len(cluster.names))
