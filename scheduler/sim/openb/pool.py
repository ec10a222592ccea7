"""The openb node list as a snugfit :class:`~scheduler.core.pool.Pool`, and openb pods as
:class:`~scheduler.core.requests.PlacementRequest` s on it.

Mapping (each openb node is one pool node):

- CPU and memory: ``cpus = cpu_milli / 1000``, ``host_memory_gib = memory_mib / 1024``, so the
  pool's millicores and MiB are the trace's, bit for bit.
- GPUs: ``count = gpu``, in ``shared`` mode with ``whole_gpus`` (idle GPUs also go whole, to
  multi-GPU pods), every GPU of one catalogue type (``gpu_type``, default A100-40GB). The pool
  model knows five GPU types and the trace seven models, and no openb scorer reads the model,
  so the model is not mapped onto a type: it is the node's ``gpu-model`` label
  (:data:`MODEL_LABEL`; also kept as :attr:`OpenbPool.models`).
- GPU model constraints: a GPU pod's ``gpu_spec`` (``V100M16|V100M32``, the ``gpuspec`` pod
  lists) becomes its node selector ``gpu-model in {V100M16,V100M32}``
  (:mod:`scheduler.core.selector`), as the authors' simulator filters nodes by model. A
  CPU-only pod's ``gpu_spec`` is ignored, as the simulator and the legacy replay do: it uses
  no GPU.
- Milli-GPU: a pod asking ``m`` milli-GPU per GPU reserves ``floor(m * capacity / 1000)`` MiB on
  a GPU of ``capacity`` MiB. Rounding down keeps the MiB test exact while one milli-GPU is more
  MiB than the pods that can share a GPU (the trace's smallest share is 50 milli-GPU, so at
  most 20; 40,960 / 1000 = 40.96 MiB per milli-GPU): their rounding losses stay under one
  milli-GPU, so pods fit a GPU in MiB exactly when their milli-GPU sum is at most 1000, and a
  GPU's free MiB floored back to milli-GPU is exactly 1000 minus that sum.
- Whole GPUs: a one-GPU pod with ``gpu_milli = 1000`` reserves all of one GPU's memory as a
  share (the node-scoring policies keep one-GPU jobs on shares on such nodes); a multi-GPU pod
  takes idle GPUs whole.
- CPU-only pods: the pool model has no GPU-less job, so one holds a 0 MiB slot on a shared GPU
  of its node (:func:`scheduler.policies.node_score.cpu_only`): CPUs, memory and one of the
  GPU's ``max_shared_jobs`` = 48 slots, no GPU capacity. The trace's CPU-only pods ask at least
  8 CPUs, so at most 16 fit a node, and no GPU runs out of slots before its node's CPUs.
- A pod asking 0 CPU or 0 memory asks 1 millicore or 1 MiB (the core's asks are positive).

Every pod of every openb pod list maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import MIB_PER_GIB, MILLI_PER_CPU, Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.selector import NodeSelector, node_selector
from scheduler.exceptions import PlacementError, TraceError
from scheduler.policies._node_scorers import MILLI_PER_GPU
from scheduler.sim.openb.trace import OpenbCluster, OpenbWorkload

__all__ = [
    "DEFAULT_GPU_TYPE",
    "DEFAULT_MAX_SHARED_JOBS",
    "MODEL_LABEL",
    "OpenbPool",
    "openb_pool",
    "openb_requests",
]

DEFAULT_GPU_TYPE = "A100-40GB"

#: The node label that carries the openb GPU model (a pod's ``gpu_spec`` selects on it).
MODEL_LABEL = "gpu-model"

# The pool model's most: room for the trace's smallest shares (20 x 50 milli-GPU) beside the
# CPU-only pods that hold 0 MiB slots on the same GPU.
DEFAULT_MAX_SHARED_JOBS = 48


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
            "whole_gpus": True,
            "max_shared_jobs": max_shared_jobs,
            "cpus": int(cluster.cpu_milli[k]) / MILLI_PER_CPU,
            "host_memory_gib": int(cluster.memory_mib[k]) / MIB_PER_GIB,
            "labels": {MODEL_LABEL: cluster.model[k]} if cluster.model[k] else {},
        }
        for k in range(len(cluster.names))
    ]
    pool = Pool.from_dict({"name": name, "nodes": nodes})
    # The floats above round-trip to the trace's integers; a drift would change every figure.
    assert np.array_equal(pool.node_cpu_milli, cluster.cpu_milli)
    assert np.array_equal(pool.node_host_mib, cluster.memory_mib)
    return OpenbPool(pool, cluster.model, gpu_type)


def openb_requests(
    pods: OpenbWorkload, opool: OpenbPool, ids: Sequence[str] | None = None
) -> list[PlacementRequest]:
    """One placement request per pod, in order (module docstring)."""
    pool = opool.pool
    t = GPU_NAMES.index(opool.gpu_type)
    cap = int(pool.type_capacity_mib[t])
    vram = np.full(len(GPU_NAMES), np.inf)
    out: list[PlacementRequest] = []
    runtime = np.where(np.arange(len(GPU_NAMES)) == t, 1.0, np.inf)
    # One canonical selector per distinct gpu_spec (the requests share it).
    selectors: dict[frozenset[str], Any] = {}
    for i in range(len(pods)):
        v = vram.copy()
        num = int(pods.num_gpu[i])
        # Whole MiB, so the core's round-up to a MiB keeps it (module docstring); CPU-only: 0.
        v[t] = (int(pods.gpu_milli[i]) * cap // MILLI_PER_GPU) / MIB_PER_GIB if num else 0.0
        spec = pods.gpu_spec[i]
        sel = None
        if spec and num:
            sel = selectors.get(spec)
            if sel is None:
                sel = selectors[spec] = _model_selector(spec, i)
        out.append(
            PlacementRequest(
                job_id=ids[i] if ids is not None else f"pod-{i}",
                vram_gib=v,
                vram_upper_gib=v,
                runtime_s=runtime,
                runtime_upper_s=runtime,
                n_gpus=max(1, num),
                gpu=opool.gpu_type,
                requested_gpu=opool.gpu_type,
                cpus=max(1, int(pods.cpu_milli[i])) / MILLI_PER_CPU,
                host_memory_gib=max(1, int(pods.memory_mib[i])) / MIB_PER_GIB,
                node_selector=sel,
            )
        )
    return out


def _model_selector(spec: frozenset[str], i: int) -> NodeSelector:
    """Pod ``i``'s ``gpu_spec`` as a node selector on :data:`MODEL_LABEL`."""
    try:
        sel = node_selector({MODEL_LABEL: sorted(spec)})
    except PlacementError as exc:
        raise TraceError(f"pod {i}: gpu_spec={'|'.join(sorted(spec))!r}: {exc}") from None
    assert sel is not None
    return sel
