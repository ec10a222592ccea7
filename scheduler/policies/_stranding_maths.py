"""Stranded GPU capacity: GPUs a node cannot use because its CPU or host memory runs out first.

FGD (:mod:`scheduler.policies.fgd`) asks whether the *next* task of each class still fits on a
node, so a node whose CPU is about to run out looks healthy until the last task that fits.
This module looks further ahead with a fluid model of the arrival mix: the target workload's
GPU tasks ask, on average, ``cpu_per_gpu`` CPU and ``mem_per_gpu`` host memory per unit of GPU
capacity. A node with ``g`` free GPU capacity, ``c`` free CPU and ``m`` free memory can host
about ``min(c / cpu_per_gpu, m / mem_per_gpu)`` more GPU capacity of that mix; the rest of its
free GPU capacity is stranded:

    stranded = max(0, g - c / cpu_per_gpu, g - m / mem_per_gpu)

A placement that leaves more stranded capacity behind is worse, even when every class still
fits now. CPU-only tasks take CPU and give nothing back, so they are pushed towards nodes with
CPU to spare (few GPUs per core) or with no free GPU left.

Unit-agnostic, like the FGD maths: the openb replay uses milli-CPU, MiB and milli-GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DemandRatios",
    "demand_ratios",
    "stranded_gpu",
    "stranding_decrease",
]


@dataclass(frozen=True, slots=True)
class DemandRatios:
    """CPU and host memory the target workload asks per unit of GPU capacity (both >= 0)."""

    cpu_per_gpu: float
    mem_per_gpu: float


def demand_ratios(
    cpu: np.ndarray, mem: np.ndarray, num_gpu: np.ndarray, gpu_per_gpu: np.ndarray
) -> DemandRatios:
    """Totals over the GPU tasks of a workload: CPU / GPU capacity and memory / GPU capacity.

    Totals rather than a mean of per-task ratios: a node fills with whatever arrives, so what
    counts is how much CPU the mix brings along with each unit of GPU.
    """
    num_gpu = np.asarray(num_gpu)
    gpu = num_gpu * np.asarray(gpu_per_gpu, float)
    sel = (num_gpu > 0) & (gpu > 0)
    total = float(gpu[sel].sum())
    if total <= 0:
        raise ValueError("demand_ratios needs at least one task that asks for a GPU; got none")
    cpu_total = float(np.asarray(cpu, float)[sel].sum())
    mem_total = float(np.asarray(mem, float)[sel].sum())
    return DemandRatios(cpu_total / total, mem_total / total)


def stranded_gpu(
    gpu_free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray, ratios: DemandRatios
) -> np.ndarray:
    """Free GPU capacity the arrival mix cannot reach for lack of CPU or memory; broadcasts."""
    g = np.asarray(gpu_free, float)
    out = np.zeros(np.broadcast_shapes(g.shape, np.shape(cpu_free), np.shape(mem_free)))
    # A mix that asks no CPU (or no memory) cannot be starved of it: that bound drops out.
    if ratios.cpu_per_gpu > 0:
        out = np.maximum(out, g - np.asarray(cpu_free, float) / ratios.cpu_per_gpu)
    if ratios.mem_per_gpu > 0:
        out = np.maximum(out, g - np.asarray(mem_free, float) / ratios.mem_per_gpu)
    return out


def stranding_decrease(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    task_gpu: np.ndarray | float,
    task_cpu: float,
    task_mem: float,
    ratios: DemandRatios,
) -> np.ndarray:
    """Stranded capacity before minus after a task takes ``task_gpu`` GPU and its CPU/memory.

    Positive is good (FGD's sign: a score rises with the decrease). ``task_gpu`` may be an
    array, one value per candidate.
    """
    before = stranded_gpu(gpu_free, cpu_free, mem_free, ratios)
    after = stranded_gpu(
        np.asarray(gpu_free, float) - task_gpu,
        np.asarray(cpu_free, float) - task_cpu,
        np.asarray(mem_free, float) - task_mem,
        ratios,
    )
    return np.asarray(before - after)
