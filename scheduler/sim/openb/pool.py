"""The openb node list as a snugfit :class:`~scheduler.core.pool.Pool`, and openb pods as
:class:`~scheduler.core.requests.PlacementRequest` s on it.

Mapping (each openb node is one pool node):

- CPU and memory: ``cpus = cpu_milli / 1000``, ``host_memory_gib = memory_mib / 1024``, so the
  pool's millicores and MiB are the trace's, bit for bit.
- GPUs: ``count = gpu``, in ``shared`` mode, every GPU of one catalogue type (``gpu_type``,
  default A100-40GB). The pool model knows five GPU types and the trace seven models, and no
  openb scorer reads the model, so the model is kept beside the pool (:attr:`OpenbPool.models`)
  rather than mapped onto a type; only the ``gpuspec`` pod lists constrain it.
- Milli-GPU: a pod asking ``m`` milli-GPU per GPU reserves ``floor(m * capacity / 1000)`` MiB on
  a GPU of ``capacity`` MiB. Rounding down keeps the MiB test exact as long as one milli-GPU is
  more MiB than ``max_shared_jobs`` (40,960 / 1000 = 40.96 > 40): the rounding losses of the
  pods on one GPU then stay under one milli-GPU, so pods fit a GPU in MiB exactly when their
  milli-GPU sum is at most 1000, and a GPU's free MiB floored back to milli-GPU is exactly 1000
  minus that sum.
- Whole GPUs: a pod with ``gpu_milli = 1000`` on one GPU reserves the whole GPU's memory on a
  shared GPU, which takes the GPU as a whole would.

What does not map yet: multi-GPU pods (a shared option holds one GPU; the pool model has no node
that hands out both shares and whole multi-GPU gangs), CPU-only pods (a placement request asks
at least one GPU), and ``gpu_spec`` constraints (one catalogue type for all models). The
functions here say so by name instead of dropping such pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import MIB_PER_GIB, MILLI_PER_CPU, Pool
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import TraceError
from scheduler.policies._node_scorers import MILLI_PER_GPU
from scheduler.sim.openb.trace import OpenbCluster, OpenbWorkload

__all__ = [
    "DEFAULT_GPU_TYPE",
    "DEFAULT_MAX_SHARED_JOBS",
    "OpenbPool",
    "core_supported",
    "openb_pool",
    "openb_requests",
]

DEFAULT_GPU_TYPE = "A100-40GB"

# Above the most pods of the trace's smallest share (50 milli-GPU: 20 per GPU), and below the
# MiB per milli-GPU of the smallest catalogue GPU (40.96), which keeps the MiB test exact.
DEFAULT_MAX_SHARED_JOBS = 40


@dataclass(frozen=True, slots=True)
class OpenbPool:
    """A pool built from an openb node list, with each node's openb GPU model beside it."""

    pool: Pool
    models: tuple[str, ...]
    gpu_type: str


def openb_pool(
    cluster: OpenbCluster,
    *,
    gpu_type: str = DEFAULT_GPU_TYPE,
    max_shared_jobs: int = DEFAULT_MAX_SHARED_JOBS,
    name: str = "openb",
) -> OpenbPool:
    """The pool of ``cluster`` (module docstring). GPU-less nodes are refused: the pool model
    has no CPU-only node; use the GPU-node list (``openb_node_list_gpu_node.csv``)."""
    if gpu_type not in GPU_NAMES:
        raise TraceError(f"gpu_type {gpu_type!r} is not a GPU type; use one of {GPU_NAMES}")
    if (cluster.n_gpu < 1).any():
        k = int(np.flatnonzero(cluster.n_gpu < 1)[0])
        raise TraceError(
            f"node {cluster.names[k]!r} has no GPU; the pool model has no CPU-only node, so "
            "build the pool from the GPU-node list (openb_node_list_gpu_node.csv)"
        )
    nodes = [
        {
            "name": cluster.names[k],
            "gpu": gpu_type,
            "count": int(cluster.n_gpu[k]),
            "mode": "shared",
            "max_shared_jobs": max_shared_jobs,
            "cpus": int(cluster.cpu_milli[k]) / MILLI_PER_CPU,
            "host_memory_gib": int(cluster.memory_mib[k]) / MIB_PER_GIB,
        }
        for k in range(len(cluster.names))
    ]
    pool = Pool.from_dict({"name": name, "nodes": nodes})
    # The floats above round-trip to the trace's integers; a drift would change every figure.
    assert np.array_equal(pool.node_cpu_milli, cluster.cpu_milli)
    assert np.array_equal(pool.node_host_mib, cluster.memory_mib)
    return OpenbPool(pool, cluster.model, gpu_type)


def core_supported(pods: OpenbWorkload) -> np.ndarray:
    """Per pod, whether the core path can place it: one GPU (share or whole), no GPU model
    constraint, non-zero CPU and memory (module docstring for the rest)."""
    no_spec = np.array([not s for s in pods.gpu_spec], bool)
    return (pods.num_gpu == 1) & no_spec & (pods.cpu_milli > 0) & (pods.memory_mib > 0)


def openb_requests(
    pods: OpenbWorkload, opool: OpenbPool, ids: Sequence[str] | None = None
) -> list[PlacementRequest]:
    """One placement request per pod, in order; TraceError names the first pod the core path
    cannot place (:func:`core_supported`)."""
    ok = core_supported(pods)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise TraceError(
            f"pod {i}: num_gpu={int(pods.num_gpu[i])}, gpu_spec={sorted(pods.gpu_spec[i])}, "
            f"cpu_milli={int(pods.cpu_milli[i])}, memory_mib={int(pods.memory_mib[i])} cannot "
            "go through the core yet (one GPU, no gpu_spec, CPU and memory > 0); filter the "
            "list with core_supported() or use the legacy replay"
        )
    pool = opool.pool
    t = GPU_NAMES.index(opool.gpu_type)
    cap = int(pool.type_capacity_mib[t])
    vram = np.full(len(GPU_NAMES), np.inf)
    out: list[PlacementRequest] = []
    for i in range(len(pods)):
        v = vram.copy()
        # Whole MiB, so the core's round-up to a MiB keeps it (module docstring).
        v[t] = (int(pods.gpu_milli[i]) * cap // MILLI_PER_GPU) / MIB_PER_GIB
        out.append(
            PlacementRequest(
                job_id=ids[i] if ids is not None else f"pod-{i}",
                vram_gib=v,
                vram_upper_gib=v,
                runtime_s=np.where(np.isfinite(v), 1.0, np.inf),
                runtime_upper_s=np.where(np.isfinite(v), 1.0, np.inf),
                n_gpus=1,
                gpu=opool.gpu_type,
                requested_gpu=opool.gpu_type,
                cpus=int(pods.cpu_milli[i]) / MILLI_PER_CPU,
                host_memory_gib=int(pods.memory_mib[i]) / MIB_PER_GIB,
            )
        )
    return out
