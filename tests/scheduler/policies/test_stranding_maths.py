"""Stranded GPU capacity: the fluid bound, its sign convention and the ratios it learns."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.policies._stranding_maths import (
    DemandRatios,
    demand_ratios,
    stranded_gpu,
    stranding_decrease,
)

R = DemandRatios(cpu_per_gpu=10.0, mem_per_gpu=40.0)  # 10 CPU and 40 memory per GPU unit


def test_ratios_are_totals_over_gpu_tasks_only() -> None:
    cpu = np.array([10.0, 30.0, 500.0])  # the CPU-only task (num_gpu 0) does not count
    mem = np.array([40.0, 40.0, 900.0])
    r = demand_ratios(cpu, mem, num_gpu=np.array([1, 2, 0]), gpu_per_gpu=np.array([1.0, 1.0, 0]))
    assert r.cpu_per_gpu == pytest.approx(40.0 / 3.0)
    assert r.mem_per_gpu == pytest.approx(80.0 / 3.0)


def test_ratios_refuse_a_workload_without_gpu_tasks() -> None:
    with pytest.raises(ValueError, match="at least one task that asks for a GPU"):
        demand_ratios(np.array([1.0]), np.array([1.0]), np.array([0]), np.array([0.0]))


def test_a_mix_without_cpu_never_strands() -> None:
    r = demand_ratios(np.zeros(2), np.zeros(2), np.array([1, 1]), np.array([1.0, 0.5]))
    assert stranded_gpu(np.array([8.0]), np.array([0.0]), np.array([0.0]), r)[0] == 0.0


@pytest.mark.parametrize(
    ("gpu", "cpu", "mem", "want"),
    [
        (8.0, 80.0, 320.0, 0.0),  # exactly balanced
        (8.0, 200.0, 1000.0, 0.0),  # CPU and memory to spare
        (8.0, 40.0, 1000.0, 4.0),  # CPU for 4 GPUs of the mix
        (8.0, 200.0, 80.0, 6.0),  # memory for 2 GPUs
        (8.0, 20.0, 80.0, 6.0),  # both short: the tighter one counts
        (0.0, 0.0, 0.0, 0.0),  # nothing free, nothing stranded
    ],
)
def test_stranded_is_free_gpu_beyond_what_cpu_and_memory_can_feed(
    gpu: float, cpu: float, mem: float, want: float
) -> None:
    assert stranded_gpu(np.array([gpu]), np.array([cpu]), np.array([mem]), R)[0] == want


def test_decrease_is_before_minus_after_and_broadcasts() -> None:
    gpu, cpu, mem = np.array([8.0, 8.0]), np.array([80.0, 80.0]), np.array([320.0, 320.0])
    # A CPU-only task of 40 CPU on a balanced node strands 4 GPUs: decrease -4.
    d = stranding_decrease(gpu, cpu, mem, 0.0, 40.0, 0.0, R)
    np.testing.assert_allclose(d, [-4.0, -4.0])
    # A task that takes GPU in the mix's own proportion strands nothing.
    np.testing.assert_allclose(stranding_decrease(gpu, cpu, mem, 2.0, 20.0, 80.0, R), [0, 0])
    # Per-candidate GPU amounts: a GPU-heavy task on a CPU-short node reduces stranding.
    d = stranding_decrease(gpu, np.array([40.0, 40.0]), mem, np.array([1.0, 3.0]), 0.0, 0.0, R)
    np.testing.assert_allclose(d, [1.0, 3.0])


def test_cpu_only_task_prefers_a_node_with_cpu_to_spare() -> None:
    # Node 0: 2 GPUs, 100 CPU (a T4-like node); node 1: 8 GPUs, 96 CPU (G2-like).
    gpu, cpu, mem = np.array([2.0, 8.0]), np.array([100.0, 96.0]), np.array([1e6, 1e6])
    d = stranding_decrease(gpu, cpu, mem, 0.0, 32.0, 0.0, R)
    assert d[0] == 0.0 and d[1] < 0.0
