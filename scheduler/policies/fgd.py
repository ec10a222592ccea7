"""Fragmentation Gradient Descent (Weng et al., USENIX ATC'23, "Beware of Fragmentation").

FGD places each task where it *increases* the expected GPU fragmentation of the cluster the
least. A node's fragmentation is measured against a target workload: a distribution of task
classes ``(cpu, gpu_per_gpu, num_gpu)`` with popularity weights. For one class, a node's idle
GPU capacity is fragmented when the class cannot run there at all (too few GPUs with enough
room, or too little CPU); when it can, only the GPUs too small for it count. The node's
fragmentation is the weight-averaged amount over classes, exactly as in the authors'
simulator (hkust-adsl/kubernetes-scheduler-simulator, ``pkg/utils/frag.go``:
``NodeGpuShareFragAmount`` summed over every quadrant except "satisfied").

The maths here is unit-agnostic: the openb replay uses milli-GPUs (``full_per_gpu=1000``)
and our pools use fractions of a GPU's memory (``full_per_gpu=1.0``). Everything is
vectorised over nodes, classes and GPU slots; nonexistent GPU slots are padded with 0 free
capacity, which never fits a GPU class and adds nothing to any sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from scheduler.policies.base import Policy, Tick
from scheduler.policies.registry import PolicyName

if TYPE_CHECKING:
    from scheduler.core.binding import Binding
    from scheduler.core.decision import Decision
    from scheduler.core.requests import PlacementRequest, RunningJob
    from scheduler.core.state import PoolState
    from scheduler.core.table import OptionTable

__all__ = [
    "FgdPolicy",
    "TaskClasses",
    "class_terms",
    "fgd_score",
    "fragmentation_after_share",
    "fragmentation_after_whole",
    "fragmentation_from_terms",
    "fragmentation_increase",
    "node_fragmentation",
    "share_candidates_fragmentation",
    "typical_task_classes",
    "whole_fragmentation_from_terms",
]

# Share of all tasks the target workload must cover; the rest (rare shapes) are dropped and
# the weights renormalised, as in the paper's simulator (podPopularityThreshold=95).
POPULARITY_THRESHOLD = 0.95


@dataclass(frozen=True, slots=True)
class TaskClasses:
    """The target workload: K task shapes and their popularity (weights sum to 1)."""

    cpu: np.ndarray  # (K,) CPU per task, in the caller's CPU unit
    gpu_per_gpu: np.ndarray  # (K,) capacity needed on each GPU; 0 = CPU-only task
    num_gpu: np.ndarray  # (K,) GPUs per task
    weight: np.ndarray  # (K,) popularity

    def __len__(self) -> int:
        return int(self.weight.shape[0])


def typical_task_classes(
    cpu: np.ndarray,
    gpu_per_gpu: np.ndarray,
    num_gpu: np.ndarray,
    threshold: float = POPULARITY_THRESHOLD,
) -> TaskClasses:
    """The most popular task shapes covering ``threshold`` of all tasks, weights renormalised.

    Ties in popularity are broken by shape so the result is deterministic.
    """
    shapes = np.stack(
        [np.asarray(cpu, float), np.asarray(gpu_per_gpu, float), np.asarray(num_gpu, float)], 1
    )
    if shapes.shape[0] == 0:
        raise ValueError("typical_task_classes needs at least one task; got an empty workload")
    uniq, counts = np.unique(shapes, axis=0, return_counts=True)
    # Most popular first; np.unique's lexicographic order breaks ties deterministically.
    order = np.argsort(-counts, kind="stable")
    uniq, counts = uniq[order], counts[order]
    cum = np.cumsum(counts) / counts.sum()
    k = int(np.searchsorted(cum, threshold - 1e-12) + 1)
    k = min(k, len(counts))
    w = counts[:k] / counts[:k].sum()
    return TaskClasses(
        cpu=uniq[:k, 0].copy(),
        gpu_per_gpu=uniq[:k, 1].copy(),
        num_gpu=uniq[:k, 2].astype(np.int64),
        weight=w.astype(float),
    )


def class_terms(
    gpu_free: np.ndarray, classes: TaskClasses
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node and class: GPUs with room, free capacity on GPUs without room; total free.

    Shapes (M, K), (M, K), (M,). These are all FGD needs about a node's GPUs, so callers that
    place many tasks keep them per node and refresh only the node that changed.
    """
    gpu_free = np.asarray(gpu_free, float)
    m = classes.gpu_per_gpu
    fits = gpu_free[:, None, :] >= m[None, :, None]  # (M, K, G)
    fits &= m[None, :, None] > 0
    count = fits.sum(-1)
    small_free = np.where(fits, 0.0, gpu_free[:, None, :]).sum(-1)
    total = gpu_free.sum(-1)
    return count, small_free, total


def fragmentation_from_terms(
    count: np.ndarray,
    small_free: np.ndarray,
    total: np.ndarray,
    cpu_free: np.ndarray,
    classes: TaskClasses,
) -> np.ndarray:
    """Weighted fragmentation from per-class terms; leading dims broadcast, class axis last.

    A class counts the node's whole free GPU capacity as fragmented unless it can run there
    (enough GPUs with room and enough CPU), in which case only GPUs too small for it count.
    CPU-only classes always count everything: they can never use a GPU.
    """
    gpu_class = classes.gpu_per_gpu > 0
    satisfied = (count >= classes.num_gpu) & (cpu_free[..., None] >= classes.cpu) & gpu_class
    amount = np.where(satisfied, small_free, np.asarray(total)[..., None])
    return np.asarray(amount @ classes.weight)


def node_fragmentation(
    gpu_free: np.ndarray, cpu_free: np.ndarray, classes: TaskClasses
) -> np.ndarray:
    """Expected fragmented GPU capacity of each node, shape (M,).

    ``gpu_free`` is (M, G) free capacity per GPU slot (0-padded); ``cpu_free`` is (M,).
    """
    count, small_free, total = class_terms(gpu_free, classes)
    return fragmentation_from_terms(count, small_free, total, np.asarray(cpu_free, float), classes)


def share_candidates_fragmentation(
    count: np.ndarray,
    small_free: np.ndarray,
    total: np.ndarray,
    cpu_free: np.ndarray,
    gpu_left: np.ndarray,
    classes: TaskClasses,
    task_gpu: float,
    task_cpu: float,
) -> np.ndarray:
    """Fragmentation after a one-GPU share task lands on one GPU, for C candidates, shape (C,).

    Candidate c is a node (its class terms ``count[c]``, ``small_free[c]``, ``total[c]``,
    ``cpu_free[c]``) and the free capacity ``gpu_left[c]`` of the GPU it would use. Only that
    GPU changes, so the node's terms update in O(K) instead of a full recount.
    """
    m = classes.gpu_per_gpu[None, :]
    gpu_class = m > 0
    before = np.asarray(gpu_left, float)[:, None]
    after = before - task_gpu
    fit_old = (before >= m) & gpu_class
    fit_new = (after >= m) & gpu_class
    count2 = count - fit_old + fit_new
    small2 = small_free - np.where(fit_old, 0.0, before) + np.where(fit_new, 0.0, after)
    return fragmentation_from_terms(
        count2, small2, np.asarray(total) - task_gpu, np.asarray(cpu_free) - task_cpu, classes
    )


def fragmentation_after_share(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    classes: TaskClasses,
    task_gpu: float,
    task_cpu: float,
) -> np.ndarray:
    """Node fragmentation after placing a one-GPU share task on each GPU slot, shape (M, G).

    Slots where the task does not fit are ``+inf``.
    """
    gpu_free = np.asarray(gpu_free, float)
    n_nodes, n_slots = gpu_free.shape
    count, small_free, total = class_terms(gpu_free, classes)
    rows = np.repeat(np.arange(n_nodes), n_slots)
    frag = share_candidates_fragmentation(
        count[rows],
        small_free[rows],
        total[rows],
        np.asarray(cpu_free, float)[rows],
        gpu_free.reshape(-1),
        classes,
        task_gpu,
        task_cpu,
    ).reshape(n_nodes, n_slots)
    return np.where(gpu_free >= task_gpu, frag, np.inf)


def whole_fragmentation_from_terms(
    count: np.ndarray,
    small_free: np.ndarray,
    total: np.ndarray,
    cpu_free: np.ndarray,
    classes: TaskClasses,
    n_gpu: int,
    task_cpu: float,
    full_per_gpu: float,
) -> np.ndarray:
    """Fragmentation after a task takes ``n_gpu`` entirely free GPUs (0 = CPU-only), (M,).

    Every GPU class fits on a full GPU, so each GPU taken leaves every class's count; which
    free GPUs are taken does not matter. The caller checks there are ``n_gpu`` free ones.
    """
    count2 = count - n_gpu * (classes.gpu_per_gpu > 0)
    return fragmentation_from_terms(
        count2,
        small_free,
        np.asarray(total) - n_gpu * full_per_gpu,
        np.asarray(cpu_free) - task_cpu,
        classes,
    )


def fragmentation_after_whole(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    classes: TaskClasses,
    n_gpu: int,
    task_cpu: float,
    full_per_gpu: float,
) -> np.ndarray:
    """Node fragmentation after placing a task on ``n_gpu`` entirely free GPUs, shape (M,).

    Nodes with fewer than ``n_gpu`` free GPUs get ``+inf``.
    """
    gpu_free = np.asarray(gpu_free, float)
    count, small_free, total = class_terms(gpu_free, classes)
    frag = whole_fragmentation_from_terms(
        count,
        small_free,
        total,
        np.asarray(cpu_free, float),
        classes,
        n_gpu,
        task_cpu,
        full_per_gpu,
    )
    n_full = (gpu_free >= full_per_gpu).sum(-1)
    return np.where(n_full >= n_gpu, frag, np.inf)


def fgd_score(frag_before: np.ndarray, frag_after: np.ndarray, scale: float) -> np.ndarray:
    """The simulator's node score: sigmoid of the fragmentation *decrease*, on 0..100.

    ``scale`` is one GPU's capacity (1000 milli-GPU there); higher is better.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        x = (frag_before - frag_after) / scale
        s = 100.0 / (1.0 + np.exp(-x))
    return np.where(np.isfinite(frag_after), s, -np.inf)


def _task_demand_gib(
    pending: Sequence[PlacementRequest], running: Sequence[RunningJob]
) -> tuple[np.ndarray, np.ndarray]:
    """Per job (queued and running): memory per GPU it holds or would hold (GiB), GPU count."""
    demand: list[float] = []
    count: list[int] = []
    for r in pending:
        res = r.reservation_gib()
        finite = res[np.isfinite(res)]
        if finite.size:
            # The smallest per-type need: what the job asks of the GPU it most likely gets.
            demand.append(float(finite.min()))
            count.append(r.n_gpus)
    for j in running:
        demand.append(float(j.option.reserved_gib))
        count.append(int(j.option.n_gpus))
    return np.asarray(demand, float), np.asarray(count, np.int64)


class FgdPolicy(Policy):
    """FGD on our pools: of the options that fit now, the one raising fragmentation least.

    The target workload is what the scheduler sees: the queued and running jobs, each as
    (memory per GPU, GPU count), binned to ``bin_gib`` and cut to the shapes covering
    ``threshold`` of them (the paper's popularity cut). A GPU's capacity is its free memory
    in GiB rather than a fraction: our pools mix 40-180 GB GPUs, and a task needs the same
    GiB on any of them, so fractions of different GPUs would not compare. A whole-mode GPU
    that holds a job has nothing free; a MIG or shared GPU has what its slices or
    reservations leave. CPU is not modelled (our options carry none), so every class's CPU
    test passes. Candidates are every node (whole GPUs) or GPU (shared) that fits now, and
    the core's slice for MIG; each scores its node's fragmentation after minus before; ties
    go to the cheaper, then the smaller option. Jobs that cannot start do not block later
    ones.
    """

    name = PolicyName.FGD

    def __init__(self, *, bin_gib: float = 2.0, threshold: float = POPULARITY_THRESHOLD) -> None:
        if bin_gib <= 0 or not 0 < threshold <= 1:
            from scheduler.exceptions import PolicyError

            raise PolicyError(
                f"fgd: bin_gib must be > 0 and threshold in (0, 1]; got bin_gib={bin_gib}, "
                f"threshold={threshold}"
            )
        self.bin_gib = float(bin_gib)
        self.threshold = float(threshold)

    def task_classes(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob] = ()
    ) -> TaskClasses | None:
        demand, count = _task_demand_gib(pending, running)
        if demand.size == 0:
            return None
        binned = np.maximum(np.ceil(demand / self.bin_gib), 1.0) * self.bin_gib
        return typical_task_classes(np.zeros_like(binned), binned, count, self.threshold)

    def decide(self, tick: Tick) -> list[Decision]:
        from scheduler.policies._each import Pick, place_each

        state = tick.state
        classes = self.task_classes(tick.pending, tick.running)

        def pick(table: OptionTable) -> Pick:
            cands = _candidates(table, state)
            if classes is None:
                delta = np.zeros(len(cands))
            else:
                delta = _increase(table, state, classes, cands)
            cost = np.array([float(table.cost[c]) for c, _ in cands])
            size = np.array([float(table.size[c]) for c, _ in cands])
            k = int(np.lexsort((np.arange(len(cands)), size, cost, delta))[0])
            c, b = cands[k]
            why = (
                f"least fragmentation added: {state.pool.class_label(c)} on {b.node} "
                f"(+{float(delta[k]):.1f} GiB expected fragmented) at ${float(table.cost[c]):.2f}"
            )
            return c, b, why

        loser = "adds more fragmentation than chosen"
        return place_each(tick, self.name.value, pick, loser, batch_check=True)


def _candidates(table: OptionTable, state: PoolState) -> list[tuple[int, Binding]]:
    """Every (option class, concrete binding) the job could take now.

    Whole GPUs: one binding per node with enough idle GPUs; shared: one per open GPU with
    room; MIG: the core's own binding (slices are placed by the profile rules).
    """
    from scheduler.core.binding import Binding
    from scheduler.core.pool import KIND_SHARED, KIND_WHOLE, MODE_SHARED

    pool = state.pool
    summary = state.summary()
    out: list[tuple[int, Binding]] = []
    n = table.request.n_gpus
    for c in np.flatnonzero(table.fits_now).tolist():
        kind = int(pool.class_kind[c])
        t = int(pool.class_type[c])
        # Nodes where the job's CPUs and host memory fit (None: wherever its GPUs do).
        host_ok = table.host_nodes(c, state)
        if table.gang[c]:
            # A multi-node gang: the core's plan (fewest racks, then nodes) is the candidate.
            out.append((c, table.bind(c, state)))
        elif kind == KIND_WHOLE:
            ok = (pool.node_type == t) & pool.node_whole & (summary.node_free >= n)
            if host_ok is not None:
                ok &= host_ok
            for k in np.flatnonzero(ok).tolist():
                a = int(pool.node_first[k])
                b = a + int(pool.node_count[k])
                idle = np.flatnonzero(~state.busy[a:b] & (state.used_mib[a:b] == 0))[:n] + a
                gpus = tuple(int(g) for g in idle)
                out.append(
                    (c, Binding(gpus, pool.nodes[k].name, None, int(pool.class_capacity_mib[c])))
                )
        elif kind == KIND_SHARED:
            need = int(table.need_mib[c])
            free = pool.capacity_mib - state.used_mib
            ok = (
                (pool.gpu_mode == MODE_SHARED)
                & (pool.gpu_type == t)
                & (state.shared_count < pool.max_shared)
                & (free >= need)
            )
            if host_ok is not None:
                ok &= host_ok[pool.gpu_node]
            for g in np.flatnonzero(ok).tolist():
                node = pool.nodes[int(pool.gpu_node[g])].name
                out.append((c, Binding((g,), node, None, int(free[g]))))
        else:
            out.append((c, table.bind(c, state)))
    return out


def _increase(
    table: OptionTable,
    state: PoolState,
    classes: TaskClasses,
    cands: Sequence[tuple[int, Binding]],
) -> np.ndarray:
    """Per candidate: the bound node's fragmentation after minus before (GiB)."""
    from scheduler.core.pool import KIND_MIG, KIND_WHOLE, MIB_PER_GIB

    pool = state.pool
    width = int(pool.node_count.max())
    # One row per (candidate, node it touches): a multi-node gang's rows add up.
    rows = [
        (i, c, k, [g for g in b.gpus if int(pool.gpu_node[g]) == k])
        for i, (c, b) in enumerate(cands)
        for k in dict.fromkeys(int(pool.gpu_node[g]) for g in b.gpus)
    ]
    before = np.zeros((len(rows), width))
    after = np.zeros((len(rows), width))
    free_gib = (pool.capacity_mib - state.used_mib) / MIB_PER_GIB
    for row, (_, c, k, gpus) in enumerate(rows):
        a = int(pool.node_first[k])
        n = int(pool.node_count[k])
        before[row, :n] = free_gib[a : a + n]
        after[row, :n] = free_gib[a : a + n]
        local = np.asarray(gpus, np.int64) - a
        kind = int(pool.class_kind[c])
        if kind == KIND_WHOLE:
            after[row, local] = 0.0
        elif kind == KIND_MIG:
            after[row, local] -= float(table.capacity_mib[c]) / MIB_PER_GIB
        else:
            after[row, local] -= float(table.need_mib[c]) / MIB_PER_GIB
    cpu = np.zeros(2 * len(rows))
    frag = node_fragmentation(np.vstack([before, np.maximum(after, 0.0)]), cpu, classes)
    per_row = np.asarray(frag[len(rows) :] - frag[: len(rows)])
    out = np.zeros(len(cands))
    np.add.at(out, np.array([r[0] for r in rows], np.int64), per_row)
    return out


def fragmentation_increase(
    table: OptionTable, state: PoolState, classes: TaskClasses
) -> np.ndarray:
    """Per option class: the least growth of a node's fragmentation (GiB) over the places the
    job could take that class now; ``+inf`` where it does not fit now."""
    out = np.full(len(table), np.inf)
    cands = _candidates(table, state)
    if cands:
        inc = _increase(table, state, classes, cands)
        for (c, _), x in zip(cands, inc, strict=True):
            out[c] = min(out[c], float(x))
    return out
