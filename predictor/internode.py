"""The gradient all-reduce a data-parallel training job runs between nodes, for pricing
multi-node placements (:mod:`scheduler.core.gang`).

The analytical runtime (:mod:`predictor._runtime`) prices a job as if it ran on nodes of 8
GPUs with a 400 Gb/s link per GPU: a job above 8 GPUs pays its data-parallel all-reduce over
``comm.inter_node_gbps``. A placement knows better: which nodes, how many GPUs each, and each
node's ``network_gbps``. :func:`gradient_sync` gives what the placer needs to swap the one
charge for the other: per job the training steps, the gradient bytes each GPU holds per step
(``trainable params x 2 bytes / (TP x PP)``, x1.5 under ZeRO-3, as the analytical runtime counts
them), its data-parallel degree and the inter-node seconds the analytical runtime already
charged. :func:`internode_allreduce_s` prices one step's all-reduce between nodes: the GPUs of a
node first reduce over NVLink, then the node's share crosses its network as a ring over the
nodes (``2(d-1)/d`` of the bytes, plus NCCL's latency terms), of which ``comm.dp_exposed`` is
not hidden behind the backward pass. Inference replicas do not synchronise: zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._jobarrays import TASKS, job_arrays
from ._runtime import _NODE_GPUS, allreduce_s
from .efficiency import default_efficiencies
from .spec import JobSpec, Task

__all__ = ["GradientSync", "gradient_sync", "internode_allreduce_s"]

_TRAINING = tuple(i for i, t in enumerate(TASKS) if Task(t).is_training)
_PEFT = (TASKS.index(Task.LORA), TASKS.index(Task.QLORA))


@dataclass(frozen=True, slots=True)
class GradientSync:
    """One job's data-parallel gradient traffic (all zero for inference)."""

    steps: float = 0.0
    grad_bytes_per_gpu: float = 0.0
    data_parallel: int = 1
    charged_s: float = 0.0  # inter-node all-reduce seconds already in the predicted runtime


def gradient_sync(specs: Sequence[JobSpec]) -> list[GradientSync]:
    """:class:`GradientSync` per spec."""
    if not specs:
        return []
    j = job_arrays(specs)
    eff = default_efficiencies()
    peft = np.isin(j.task, _PEFT)
    trainable = np.where(peft, j.lora_params, j.total_params) / (j.tp * j.pp)
    grad = trainable * 2.0 * np.where(j.zero_stage >= 3, 1.5, 1.0)
    link = np.full_like(grad, eff["comm.inter_node_gbps"] * 1e9)
    charged = eff["comm.dp_exposed"] * allreduce_s(grad, j.dp, link, eff) * j.steps
    charged = np.where(j.n_gpus > _NODE_GPUS, charged, 0.0)
    train = np.isin(j.task, _TRAINING)
    return [
        GradientSync(float(s), float(g), int(d), float(c)) if t else GradientSync()
        for s, g, d, c, t in zip(
            j.steps.tolist(),
            grad.tolist(),
            j.dp.tolist(),
            charged.tolist(),
            train.tolist(),
            strict=True,
        )
    ]


def internode_allreduce_s(
    sync: GradientSync, gpus_per_node: int, n_nodes: int, network_gbps: float
) -> float:
    """Exposed seconds of the whole run's gradient all-reduce between ``n_nodes`` nodes of
    ``gpus_per_node`` GPUs each over ``network_gbps`` per node."""
    d = min(n_nodes, max(sync.data_parallel, 1))
    if sync.steps <= 0 or d <= 1:
        return 0.0
    eff = default_efficiencies()
    node_bytes = np.array([sync.grad_bytes_per_gpu * gpus_per_node])
    link = np.array([network_gbps / 8.0 * 1e9])
    step = allreduce_s(node_bytes, np.array([float(d)]), link, eff)
    return float(eff["comm.dp_exposed"] * step[0] * sync.steps)
