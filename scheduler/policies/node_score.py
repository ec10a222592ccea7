"""The openb node scorers as live policies: FGD, BestFit, DotProduct, GpuPacking, GpuClustering,
Random and our FGD-strand, scored exactly as the openb replay scores them
(:mod:`scheduler.policies._node_scorers`), on any snugfit pool.

Each job is a pod of the FGD paper's simulator: its CPUs and host memory on the node (its own
figures, else the node's share of its slot, :mod:`scheduler.core.host`), its GPU count, and
per GPU a share in milli-GPU (1000 for whole GPUs; a shared GPU's reservation over the GPU's
memory, rounded up). A node shows the scorer its free millicores, free host MiB and each GPU's
free milli-GPU: a whole-mode GPU is 1000 when idle and 0 when held, a shared GPU its free memory
over its capacity (rounded down; 0 once it runs ``max_shared_jobs``), a MIG GPU its free memory
the same way. Candidates are the nodes where the job fits now on every resource (and that its
node selector accepts, :mod:`scheduler.core.selector`), per option
class; the highest score wins, ties go to the node that comes first in the node order (the
pool's, or a random permutation drawn from ``seed``, as the paper's simulator renames nodes).
A shared job lands on the GPU the scorer picks; a whole-GPU job on the node's first idle GPUs;
a MIG job on the slice the core's profile rules pick on the chosen node. On a shared node that
also serves whole GPUs (``whole_gpus``) one-GPU jobs take shares and only gangs take whole
GPUs, as pods do on a Kubernetes GPU-share node. A job that asks no GPU memory at all is a
CPU-only job (:func:`cpu_only`): it holds a 0 MiB slot on a shared GPU and scores as a pod
without GPUs. Across option
classes the best score wins, then the cheaper class.

FGD's target workload is either given (``classes``: the trace's pod shapes, as the replay uses)
or read from the queue and the running jobs at each call, as the live ``fgd`` policy does.
``DotProduct`` is an approximation (see :mod:`scheduler.policies._node_scorers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from scheduler.core.binding import Binding
from scheduler.core.host import class_nodes, demand, gpu_nodes_now
from scheduler.core.pool import KIND_MIG, KIND_SHARED, KIND_WHOLE, MODE_SHARED, MODE_WHOLE, Pool
from scheduler.exceptions import PolicyError
from scheduler.policies._each import Pick, place_each
from scheduler.policies._node_scorers import (
    MILLI_PER_GPU,
    N_TAGS,
    STRANDING_WEIGHT,
    NodeView,
    PodShape,
    Scorer,
    make_fgd,
    score_bestfit,
    score_dotproduct,
    score_gpuclustering,
    score_gpupacking,
    score_random,
    state_key,
    tag_of,
)
from scheduler.policies._stranding_maths import DemandRatios, demand_ratios
from scheduler.policies.base import Policy, Tick
from scheduler.policies.fgd import (
    TaskClasses,
    class_terms,
    fragmentation_from_terms,
    typical_task_classes,
)
from scheduler.policies.registry import PolicyName

if TYPE_CHECKING:
    from scheduler.core.decision import Decision, Option
    from scheduler.core.requests import PlacementRequest, RunningJob
    from scheduler.core.state import PoolState
    from scheduler.core.table import OptionTable

__all__ = [
    "STRANDING_WEIGHT",
    "BestFitNodePolicy",
    "DotProductPolicy",
    "FgdNodePolicy",
    "FgdStrandPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "NodeScorePolicy",
    "RandomNodePolicy",
    "job_milli",
    "node_view",
]


def job_milli(pool: Pool, c: int, need_mib: int) -> int:
    """The job's milli-GPU per GPU on class ``c``: 1000 for whole GPUs, else its slot's memory
    (shared: the reservation; MIG: the slice) over the GPU's, rounded up. A shared slot of
    0 MiB is 0: a CPU-only job (see :func:`cpu_only`)."""
    if int(pool.class_kind[c]) == KIND_WHOLE:
        return MILLI_PER_GPU
    gpu_cap = int(pool.type_capacity_mib[int(pool.class_type[c])])
    slot = need_mib if int(pool.class_kind[c]) == KIND_SHARED else int(pool.class_capacity_mib[c])
    return min(MILLI_PER_GPU, -(-slot * MILLI_PER_GPU // gpu_cap))


def cpu_only(request: PlacementRequest) -> bool:
    """Whether the job asks no GPU memory anywhere: a CPU-only job (an openb CPU-only pod).

    The pool model has no GPU-less job, so such a job holds a 0 MiB slot on a shared GPU of
    its node: it takes CPUs, host memory and one of the GPU's ``max_shared_jobs`` slots, and
    no GPU capacity. These policies place it only there, as a GPU-less pod.
    """
    res = request.reservation_gib()
    finite = res[np.isfinite(res)]
    return bool(finite.size) and bool((finite <= 0).all())


def _gpu_milli_free(state: PoolState) -> np.ndarray:
    """Per GPU, the free milli-GPU a scorer sees (module docstring), shape (n_gpus,)."""
    return _gpu_milli_free_rows(state, 0, state.pool.n_gpus)


def _option_tag(pool: Pool, option: Option) -> int:
    if option.kind == "whole":
        return tag_of(option.n_gpus, MILLI_PER_GPU)
    if option.reserved_gib <= 0:  # a CPU-only job's 0 MiB slot: no GPU, no tag
        return -1
    return tag_of(1, _option_milli(pool, option))


def node_view(state: PoolState, *, tags: bool = True) -> NodeView:
    """The scorers' view of every node of ``state``'s pool (module docstring); ``tags=False``
    leaves the per-node pod tags at zero (only GpuClustering reads them)."""
    p = state.pool
    width = int(p.node_count.max())
    slot = np.arange(width)[None, :]
    mask = slot < p.node_count[:, None]
    gidx = np.where(mask, p.node_first[:, None] + slot, 0)
    gpu_free = np.where(mask, _gpu_milli_free(state)[gidx], 0)
    tag_counts = np.zeros((len(p.nodes), N_TAGS), np.int64)
    for opt in state.allocations().values() if tags else ():
        t = _option_tag(p, opt)
        if t >= 0 and opt.gpu_indices:
            tag_counts[int(p.gpu_node[opt.gpu_indices[0]]), t] += 1
    gpu_free = gpu_free.astype(np.int64)
    return NodeView(
        cpu_free=p.node_cpu_milli - state.node_cpu_milli,
        mem_free=p.node_host_mib - state.node_host_mib,
        gpu_free=gpu_free,
        tags=tag_counts,
        n_gpu=p.node_count.copy(),
        gpu_max=gpu_free.max(1),
    )


class NodeScorePolicy(Policy):
    """Place each job, in queue order, on the node its scorer ranks highest (module docstring).

    ``seed`` draws the node order that breaks ties (and seeds the Random scorer's draws); None
    keeps the pool's node order. Jobs that cannot start do not block later ones.
    """

    score_label: ClassVar[str] = "score"
    # Whether the scorer reads per-node pod tags (GpuClustering); building them walks every
    # allocation, so only the policy that needs them pays for it.
    needs_tags: ClassVar[bool] = False

    def __init__(
        self,
        *,
        seed: int | None = None,
        node_rank: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        """``node_rank`` (a permutation of the pool's nodes) and ``rng`` override the ones
        drawn from ``seed``: the openb replay passes its own, so both paths draw alike."""
        self.seed = seed
        # Given: drawn on across calls (the replay's stream). Else each call draws from
        # (seed, state version), so the same inputs give the same decisions.
        self._rng = rng
        self._fixed_rank = None if node_rank is None else np.asarray(node_rank, np.int64)
        self._rank: dict[int, np.ndarray] = {}
        # The view left by the last call, reused while the state has not moved since.
        self._view: tuple[int, int, NodeView] | None = None

    # -- hooks --------------------------------------------------------------------------------

    #: A scorer that does not depend on the workload (FGD's does: it overrides :meth:`scorer`).
    fixed_scorer: ClassVar[Any] = None  # a staticmethod wrapping a Scorer

    def scorer(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> Scorer:
        if self.fixed_scorer is None:
            raise NotImplementedError(f"{type(self).__name__} names no scorer")
        return self.fixed_scorer

    def prepare(self, view: NodeView) -> None:
        """Fill any per-node terms the scorer keeps (FGD's class terms)."""

    def refresh(self, view: NodeView, state: PoolState, k: int) -> None:
        """Bring node ``k`` of ``view`` up to date after a placement there."""
        p = state.pool
        a, n = int(p.node_first[k]), int(p.node_count[k])
        view.cpu_free[k] = int(p.node_cpu_milli[k] - state.node_cpu_milli[k])
        view.mem_free[k] = int(p.node_host_mib[k] - state.node_host_mib[k])
        view.gpu_free[k, :n] = _gpu_milli_free_rows(state, a, n)
        if view.gpu_max is not None:
            view.gpu_max[k] = view.gpu_free[k].max()

    # -- the loop -----------------------------------------------------------------------------

    def node_rank(self, pool: Pool) -> np.ndarray:
        key = id(pool)
        if key not in self._rank:
            n = len(pool.nodes)
            if self._fixed_rank is not None:
                if self._fixed_rank.shape != (n,):
                    raise PolicyError(
                        f"{self.name.value}: node_rank must rank the pool's {n} nodes; got "
                        f"shape {self._fixed_rank.shape}"
                    )
                self._rank = {key: self._fixed_rank}
                return self._fixed_rank
            seeded = np.random.default_rng(self.seed)
            self._rank = {key: np.arange(n) if self.seed is None else seeded.permutation(n)}
        return self._rank[key]

    def decide(self, tick: Tick) -> list[Decision]:
        state = tick.state
        pool = state.pool
        scorer = self.scorer(tick.pending, tick.running, pool)
        view = self._view_of(state)
        rank = self.node_rank(pool)
        rng = self._rng
        if rng is None:
            rng = np.random.default_rng([self.seed or 0, state.version])
        label = self.score_label

        def pick(table: OptionTable) -> Pick | None:
            best = self._best(table, state, view, scorer, rank, rng)
            if best is None:
                return None
            c, binding, score = best
            why = (
                f"highest {label}: {pool.class_label(c)} on {binding.node} "
                f"(score {score:.0f}) at ${float(table.cost[c]):.2f}"
            )
            return c, binding, why

        def placed(table: OptionTable, binding: Binding) -> None:
            k = int(pool.gpu_node[binding.gpus[0]])
            t = _option_tag(pool, state.option_of(table.request.job_id))
            if t >= 0:
                view.tags[k, t] += 1
            self.refresh(view, state, k)

        out = place_each(tick, self.name.value, pick, f"lower {label} than chosen", placed=placed)
        self._view = (id(state), state.version, view)
        return out

    def _view_of(self, state: PoolState) -> NodeView:
        """The scorers' view of ``state``: the last call's when the state has not moved since
        (and the scorer's terms did not change), else a fresh one."""
        if self._view is not None and self.reuse_terms():
            sid, version, view = self._view
            if sid == id(state) and version == state.version:
                return view
        view = node_view(state, tags=self.needs_tags)
        self.prepare(view)
        return view

    def reuse_terms(self) -> bool:
        """Whether per-node terms from the last call are still valid (a fixed target)."""
        return True

    def _best(
        self,
        table: OptionTable,
        state: PoolState,
        view: NodeView,
        scorer: Scorer,
        rank: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[int, Binding, float] | None:
        """(class, binding, score) of the best-scored candidate node over the classes that fit
        now; None when no node passes the scorer's own fit test."""
        pool = state.pool
        now = state.summary()
        req = table.request
        found: list[tuple[float, float, int, int, Binding]] = []
        no_gpu = cpu_only(req)
        for c in np.flatnonzero(table.fits_now).tolist():
            kind = int(pool.class_kind[c])
            if no_gpu and kind != KIND_SHARED:
                continue
            members = class_nodes(pool)[c]
            if kind == KIND_WHOLE and req.n_gpus == 1:
                # On a shared node that also serves whole GPUs a one-GPU job takes a share (up
                # to the GPU's whole memory), so scorers see its real milli-GPU.
                members = members & (pool.node_mode != MODE_SHARED)
                if not members.any():
                    continue
            need = int(table.need_mib[c])
            milli = job_milli(pool, c, need)
            ask = req.host_ask
            cpu_a: np.ndarray
            host_a: np.ndarray
            if ask.cpu_milli >= 0 and ask.host_mib >= 0:
                # The job's own figures: one ask on every node (the openb pods' case).
                cpu_a, host_a = np.asarray(ask.cpu_milli), np.asarray(ask.host_mib)
            else:
                cpu_a, host_a = demand(pool, c, req.n_gpus, ask, need)
            ok = gpu_nodes_now(pool, now, c, req.n_gpus, need) & members
            if table.node_ok is not None:  # the job's node selector
                ok &= table.node_ok
            ok &= (cpu_a <= now.node_cpu_free) & (host_a <= now.node_host_free)
            if kind == KIND_SHARED:
                gmax = view.gpu_max if view.gpu_max is not None else view.gpu_free.max(1)
                ok &= gmax >= milli
            idx = np.flatnonzero(ok)
            if idx.size == 0:
                continue
            for g_cpu, g_host, sub in _ask_groups(cpu_a, host_a, idx):
                pod = PodShape(int(g_cpu), int(g_host), 0 if no_gpu else req.n_gpus, milli)
                score, gpu = scorer(view, sub, pod, rng)
                top = np.flatnonzero(score == score.max())
                j = int(top[np.argmin(rank[sub[top]])])
                k = int(sub[j])
                b = _binding(table, state, c, k, int(gpu[j]), need)
                found.append((-float(score[j]), float(table.cost[c]), int(rank[k]), c, b))
        if not found:
            return None
        s, _, _, c, b = min(found, key=lambda x: x[:4])
        return c, b, -s


def _ask_groups(
    cpu_a: np.ndarray, host_a: np.ndarray, idx: np.ndarray
) -> list[tuple[int, int, np.ndarray]]:
    """The candidate nodes ``idx`` grouped by the job's (millicores, MiB) ask there:
    (cpu, host, nodes) per group. One group when the job states its own figures (0-d asks)."""
    if cpu_a.ndim == 0:
        return [(int(cpu_a), int(host_a), idx)]
    cpu, host = cpu_a[idx], host_a[idx]
    if (cpu == cpu[0]).all() and (host == host[0]).all():
        return [(int(cpu[0]), int(host[0]), idx)]
    # Share-sized asks differ by node; score each group of equal asks at once.
    groups = np.unique(np.stack([cpu, host], 1), axis=0).tolist()
    return [(int(c), int(h), idx[(cpu == c) & (host == h)]) for c, h in groups]


def _gpu_milli_free_rows(state: PoolState, a: int, n: int) -> np.ndarray:
    p = state.pool
    sl = slice(a, a + n)
    cap = p.capacity_mib[sl]
    free = (cap - state.used_mib[sl]) * MILLI_PER_GPU // cap
    mode = p.gpu_mode[sl]
    idle = ~state.busy[sl] & (state.used_mib[sl] == 0)
    free = np.where(mode == MODE_WHOLE, np.where(idle, MILLI_PER_GPU, 0), free)
    full = (mode == MODE_SHARED) & (state.shared_count[sl] >= p.max_shared[sl])
    return np.asarray(np.where(full, 0, free), np.int64)


def _binding(
    table: OptionTable, state: PoolState, c: int, k: int, slot: int, need_mib: int
) -> Binding:
    """Concrete GPUs on node ``k`` for class ``c``: the scorer's GPU ``slot`` (shared), the
    first idle GPUs (whole) or the core's slice on that node (MIG)."""
    pool = state.pool
    a = int(pool.node_first[k])
    kind = int(pool.class_kind[c])
    name = pool.nodes[k].name
    if kind == KIND_WHOLE:
        n = table.request.n_gpus
        b = a + int(pool.node_count[k])
        idle = np.flatnonzero(~state.busy[a:b] & (state.used_mib[a:b] == 0))[:n] + a
        return Binding(tuple(int(g) for g in idle), name, None, int(pool.class_capacity_mib[c]))
    if kind == KIND_SHARED:
        n = int(pool.node_count[k])
        milli = job_milli(pool, c, need_mib)
        if slot < 0 and milli == 0:  # CPU-only: the open GPU with the fewest jobs
            count = state.shared_count[a : a + n]
            open_ = count < pool.max_shared[a : a + n]
            slot = int(np.argmin(np.where(open_, count, np.iinfo(np.int32).max)))
        elif slot < 0:  # the scorer did not pick a GPU: the fullest with room
            free = _gpu_milli_free_rows(state, a, n)
            slot = int(np.argmin(np.where(free >= milli, free, MILLI_PER_GPU + 1)))
        g = a + slot
        return Binding((g,), name, None, int(pool.capacity_mib[g] - state.used_mib[g]))
    assert kind == KIND_MIG
    only = np.zeros(len(pool.nodes), bool)
    only[k] = True
    from scheduler.core.binding import bind

    return bind(pool, state, c, 1, need_mib, "pack", only)


class RandomNodePolicy(NodeScorePolicy):
    name = PolicyName.RANDOM
    score_label = "random score"
    fixed_scorer = staticmethod(score_random)


class BestFitNodePolicy(NodeScorePolicy):
    """The paper's BestFit: least CPU and GPU left on the node (normalised, averaged)."""

    name = PolicyName.BESTFIT_NODE
    score_label = "best-fit score"
    fixed_scorer = staticmethod(score_bestfit)


class DotProductPolicy(NodeScorePolicy):
    """Tetris alignment of (CPU, GPU): an approximation of the simulator's DotProduct (its
    "merge" dimension extension is stood in for by the chosen GPU's free share)."""

    name = PolicyName.DOTPRODUCT
    score_label = "dot-product score"
    fixed_scorer = staticmethod(score_dotproduct)


class GpuPackingPolicy(NodeScorePolicy):
    name = PolicyName.GPUPACKING
    score_label = "GPU-packing score"
    fixed_scorer = staticmethod(score_gpupacking)


class GpuClusteringPolicy(NodeScorePolicy):
    name = PolicyName.GPUCLUSTERING
    score_label = "GPU-clustering score"
    needs_tags = True
    fixed_scorer = staticmethod(score_gpuclustering)


def _pod_shapes(
    pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(cpu, mem, num_gpu, milli) per queued and running job, as the target workload.

    A job without its own CPU / memory figures counts the pool's mean share per GPU.
    """
    cpu_per = float(pool.node_cpu_milli.sum()) / max(1, pool.n_gpus)
    mem_per = float(pool.node_host_mib.sum()) / max(1, pool.n_gpus)
    rows: list[tuple[float, float, int, int]] = []
    for r in pending:
        res = r.reservation_gib()
        ok = np.isfinite(res) & (pool.type_capacity_mib > 0)
        if not ok.any():
            continue
        t = int(np.flatnonzero(ok)[np.argmin(res[ok])])
        frac = min(1.0, float(res[t]) * 1024 / float(pool.type_capacity_mib[t]))
        milli = MILLI_PER_GPU if r.n_gpus > 1 else max(1, math.ceil(frac * MILLI_PER_GPU))
        share = r.n_gpus * milli / MILLI_PER_GPU
        ask = r.host_ask
        rows.append(
            (
                ask.cpu_milli if ask.cpu_milli >= 0 else cpu_per * share,
                ask.host_mib if ask.host_mib >= 0 else mem_per * share,
                r.n_gpus,
                milli,
            )
        )
    for j in running:
        o = j.option
        milli = MILLI_PER_GPU if o.kind == "whole" else max(1, _option_milli(pool, o))
        rows.append(((o.cpus or 0.0) * 1000, (o.host_memory_gib or 0.0) * 1024, o.n_gpus, milli))
    a = np.asarray(rows, float).reshape(-1, 4)
    return a[:, 0], a[:, 1], a[:, 2].astype(np.int64), a[:, 3]


def _option_milli(pool: Pool, option: Option) -> int:
    cap = float(pool.capacity_mib[option.gpu_indices[0]]) if option.gpu_indices else 0.0
    if cap <= 0:
        return MILLI_PER_GPU
    return min(MILLI_PER_GPU, math.ceil(option.reserved_gib * 1024 * MILLI_PER_GPU / cap))


class FgdNodePolicy(NodeScorePolicy):
    """FGD as the paper's simulator scores it (CPU included), on any pool.

    ``classes`` fixes the target workload (the openb replay passes the trace's pod shapes);
    without it the queued and running jobs are the target, re-read at each call.
    """

    name = PolicyName.FGD_NODE
    score_label = "FGD score"

    def __init__(
        self,
        *,
        seed: int | None = None,
        node_rank: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
        classes: TaskClasses | None = None,
    ) -> None:
        super().__init__(seed=seed, node_rank=node_rank, rng=rng)
        self.classes = classes
        self._active: TaskClasses | None = None
        self._with_mem = False

    def target(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> TaskClasses:
        if self.classes is not None:
            return self.classes
        cpu, _, num, milli = _pod_shapes(pending, running, pool)
        if cpu.size == 0:
            raise PolicyError("fgd_node: no queued or running job to take a target workload from")
        return typical_task_classes(cpu, np.where(num > 0, milli, 0), num)

    def scorer(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> Scorer:
        self._active = self.target(pending, running, pool)
        return make_fgd(self._active)

    def reuse_terms(self) -> bool:
        return self.classes is not None

    def prepare(self, view: NodeView) -> None:
        assert self._active is not None
        terms = class_terms(view.gpu_free, self._active)
        frag = fragmentation_from_terms(*terms, view.cpu_free.astype(float), self._active)
        view.fgd = (*terms, frag)
        view.key = state_key(view, slice(None), self._with_mem)

    def refresh(self, view: NodeView, state: PoolState, k: int) -> None:
        super().refresh(view, state, k)
        assert self._active is not None and view.fgd is not None and view.key is not None
        count, small, total, frag = view.fgd
        c1, s1, t1 = class_terms(view.gpu_free[k : k + 1], self._active)
        count[k], small[k], total[k] = c1[0], s1[0], t1[0]
        cpu = view.cpu_free[k : k + 1].astype(float)
        frag[k] = fragmentation_from_terms(c1, s1, t1, cpu, self._active)[0]
        view.key[k] = state_key(view, slice(k, k + 1), self._with_mem)[0]


class FgdStrandPolicy(FgdNodePolicy):
    """Ours: FGD plus ``weight`` times the decrease of stranded GPU capacity
    (:mod:`scheduler.policies._stranding_maths`). ``ratios`` fixes the arrival mix's CPU and
    memory per GPU (the replay passes the trace's); else it is read from the queue and the
    running jobs."""

    name = PolicyName.FGD_STRAND
    score_label = "FGD-strand score"

    def __init__(
        self,
        *,
        seed: int | None = None,
        node_rank: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
        classes: TaskClasses | None = None,
        ratios: DemandRatios | None = None,
        weight: float = STRANDING_WEIGHT,
    ) -> None:
        if not (math.isfinite(weight) and weight >= 0):
            raise PolicyError(f"fgdstrand: weight must be a finite number >= 0; got {weight!r}")
        super().__init__(seed=seed, node_rank=node_rank, rng=rng, classes=classes)
        self.ratios = ratios
        self.weight = float(weight)
        self._with_mem = True

    def scorer(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> Scorer:
        self._active = self.target(pending, running, pool)
        ratios = self.ratios
        if ratios is None:
            cpu, mem, num, milli = _pod_shapes(pending, running, pool)
            ratios = demand_ratios(cpu, mem, num, milli)
        return make_fgd(self._active, (ratios, self.weight))
