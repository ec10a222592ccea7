"""The traffic a training job sends between nodes, for pricing multi-node placements
(:mod:`scheduler.core.gang`): the data-parallel gradient all-reduce and the pipeline-parallel
activations.

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

Pipeline parallelism sends activations point to point between stages: one micro-batch's
``tokens x hidden x dtype bytes`` forward and its gradient back, at every stage boundary, every
micro-batch. The analytical runtime charges none of it (stages of one node talk over NVLink,
small next to their compute). Between nodes it is not small: :func:`internode_pipeline_s` prices
the boundaries a placement puts on the network. Ranks are laid out as Megatron does (TP
fastest, then DP, then PP), so stage ``k`` holds ranks ``[k W/PP, (k+1) W/PP)`` and a boundary
crosses nodes where a node ends; with ``n`` nodes, ``min(PP, n) - 1`` boundaries do. The
pipeline runs at the pace of its slowest stage, one of those that cross, so every micro-batch
slot of the 1F1B schedule (``micro-batches + PP - 1`` slots a step, the bubble included) waits
for one hop forward and one back; boundaries on other node pairs run at the same time. A hop
carries, over the sending node's ``network_gbps``, the activations of every data-parallel
replica crossing that boundary there (``min(node GPUs, W/PP) / TP`` of them: a TP group sends
its activation once, scattered over its ranks and gathered over NVLink, as Megatron does).
The transfers are counted as exposed: 1F1B's blocking send/recv sits on the critical path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._jobarrays import TASKS, job_arrays
from ._runtime import _NODE_GPUS, allreduce_s
from .efficiency import default_efficiencies
from .spec import JobSpec, Task

__all__ = ["GradientSync", "gradient_sync", "internode_allreduce_s", "internode_pipeline_s"]

_TRAINING = tuple(i for i, t in enumerate(TASKS) if Task(t).is_training)
_PEFT = (TASKS.index(Task.LORA), TASKS.index(Task.QLORA))


@dataclass(frozen=True, slots=True)
class GradientSync:
    """One job's inter-node traffic per training step (all zero for inference): the
    data-parallel gradients, and the pipeline's activations at a stage boundary."""

    steps: float = 0.0
    grad_bytes_per_gpu: float = 0.0
    data_parallel: int = 1
    charged_s: float = 0.0  # inter-node all-reduce seconds already in the predicted runtime
    pipeline_parallel: int = 1
    tensor_parallel: int = 1
    activation_bytes: float = 0.0  # one micro-batch at one boundary: tokens x hidden x dtype
    micro_batches: float = 1.0  # per step (gradient accumulation)


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
    act = j.batch * j.seq_len * j.hidden * j.compute_bytes
    train = np.isin(j.task, _TRAINING)
    return [
        GradientSync(float(s), float(g), int(d), float(c), int(p), int(k), float(a), float(m))
        if t
        else GradientSync()
        for s, g, d, c, p, k, a, m, t in zip(
            j.steps.tolist(),
            grad.tolist(),
            j.dp.tolist(),
            charged.tolist(),
            j.pp.tolist(),
            j.tp.tolist(),
            act.tolist(),
            np.maximum(j.grad_accum, 1.0).tolist(),
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


def internode_pipeline_s(
    sync: GradientSync, gpus_per_node: int, n_nodes: int, network_gbps: float
) -> float:
    """Seconds of the whole run's pipeline activations sent between ``n_nodes`` nodes of
    ``gpus_per_node`` GPUs each over ``network_gbps`` per node (zero when every stage boundary
    stays inside a node: one node, or no pipeline)."""
    pp = max(sync.pipeline_parallel, 1)
    if sync.steps <= 0 or pp <= 1 or min(pp, n_nodes) <= 1:
        return 0.0
    eff = default_efficiencies()
    stage_gpus = gpus_per_node * n_nodes / pp
    replicas = max(min(gpus_per_node, stage_gpus) / max(sync.tensor_parallel, 1), 1.0)
    link = network_gbps / 8.0 * 1e9 * eff["comm.link_efficiency"]
    hop_s = eff["comm.latency_s"] + replicas * sync.activation_bytes / link
    slots = sync.micro_batches + pp - 1.0
    return float(2.0 * hop_s * slots * sync.steps)
