"""The GPU pool: nodes of one GPU type each, whole / MIG / shared, and its mutable state.

A :class:`Pool` is the static description (loaded from TOML through pydantic, then flattened to
numpy arrays, one entry per GPU). A :class:`PoolState` is what is taken right now; it is plain
numpy so placement can scan a 10,000-GPU pool per job in microseconds.

Memory is accounted in whole MiB (``int64``): capacities are floored and reservations ceiled to
a MiB, so ``allocate`` followed by ``release`` restores every array bit for bit, and a
reservation is never below the predicted bound it came from.

MIG follows the NVIDIA MIG user guide's placement model for the 7-compute / 8-memory-slice GPUs
(A100, H100, H200, B200): a profile placed at start slot ``s`` takes compute slices
``[s, s + compute_slices)`` and memory slices ``[s, s + memory_slices)``; it may start only at the
slots its profile lists. A GPU's occupancy is one 15-bit mask (7 compute bits, then 8 memory
bits), so "is this slice free" is one AND. A static layout fixes which (profile, start) instances
exist; ``mig = "dynamic"`` lets any valid instance be created on demand when its slices are free.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from predictor.exceptions import UnknownGpuError
from predictor.gpus import GPU_NAMES, GpuType, MigProfile, gpu_catalogue, with_prices

from scheduler.exceptions import PlacementError, PoolError

if TYPE_CHECKING:
    from scheduler.core.decision import Option

__all__ = [
    "KIND_MIG",
    "KIND_SHARED",
    "KIND_WHOLE",
    "MIB_PER_GIB",
    "MODE_MIG",
    "MODE_SHARED",
    "MODE_WHOLE",
    "Node",
    "NodeConfig",
    "Pool",
    "PoolConfig",
    "PoolState",
    "Summary",
    "TypeFree",
    "load_pool",
    "synthetic_pool",
]

MIB_PER_GIB = 1024
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8

MODE_WHOLE, MODE_MIG, MODE_SHARED = 0, 1, 2
_MODE_CODES: dict[str, int] = {"whole": MODE_WHOLE, "mig": MODE_MIG, "shared": MODE_SHARED}
# Option classes (columns of the per-job option vector) use the same codes as node modes.
KIND_WHOLE, KIND_MIG, KIND_SHARED = MODE_WHOLE, MODE_MIG, MODE_SHARED
KIND_NAMES: tuple[Literal["whole", "mig", "shared"], ...] = ("whole", "mig", "shared")

# Which parts of a state summary an allocation of each kind makes stale (bit = 1 << MODE_*).
_DIRTY_WHOLE, _DIRTY_MIG, _DIRTY_SHARED = 1 << MODE_WHOLE, 1 << MODE_MIG, 1 << MODE_SHARED
_ALL_KINDS = _DIRTY_WHOLE | _DIRTY_MIG | _DIRTY_SHARED

_POPCOUNT = np.array([bin(i).count("1") for i in range(1 << 15)], dtype=np.int8)


def gib_to_mib_ceil(gib: float) -> int:
    """Reservations round *up* to a MiB so they never drop below the bound they came from."""
    # Scaling by 1024 is exact in binary floating point, so k/1024 GiB maps to exactly k MiB.
    return math.ceil(gib * MIB_PER_GIB)


def mig_mask(profile: MigProfile, start: int) -> int:
    compute = ((1 << profile.compute_slices) - 1) << start
    memory = ((1 << profile.memory_slices) - 1) << start
    return compute | (memory << MIG_COMPUTE_SLICES)


# ---------------------------------------------------------------------------------------------
# TOML boundary


class NodeConfig(BaseModel):
    """One ``[[nodes]]`` table of a pool file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100)
    gpu: str
    count: int = Field(default=8, ge=1, le=64)
    mode: Literal["whole", "mig", "shared"] = "whole"
    # Static: one list of profile names (optionally "name@start") per GPU, or a single list
    # applied to every GPU. Dynamic: the string "dynamic".
    mig: Literal["dynamic"] | list[list[str]] | list[str] | None = None
    max_shared_jobs: int = Field(default=4, ge=1, le=48)


class PoolConfig(BaseModel):
    """A whole pool file: ``name``, optional ``[prices]`` and ``[[nodes]]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "pool"
    prices: dict[str, float] = Field(default_factory=dict)
    # Runtime multiplier for a job sharing a GPU through MPS; 1.0 assumes the co-located jobs
    # are the small ones that do not saturate the GPU (the reason to share at all).
    shared_slowdown: float = Field(default=1.0, ge=1.0, le=10.0)
    nodes: list[NodeConfig] = Field(min_length=1)

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, v: list[NodeConfig]) -> list[NodeConfig]:
        seen: set[str] = set()
        for n in v:
            if n.name in seen:
                raise ValueError(f"node name {n.name!r} appears twice; node names must be unique")
            seen.add(n.name)
        return v


# ---------------------------------------------------------------------------------------------
# Static pool


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_type: str
    count: int
    mode: Literal["whole", "mig", "shared"]
    first_gpu: int
    # Static MIG: per GPU, the (profile, start) instances; dynamic MIG and other modes: None.
    mig_layout: tuple[tuple[tuple[str, int], ...], ...] | None = None
    max_shared_jobs: int = 1

    @property
    def gpu_indices(self) -> range:
        return range(self.first_gpu, self.first_gpu + self.count)

    @property
    def mig_dynamic(self) -> bool:
        return self.mode == "mig" and self.mig_layout is None


@dataclass(frozen=True, eq=False)
class Pool:
    """Static pool description flattened to per-GPU and per-option-class arrays.

    Option classes are the columns of every job's option vector: one ``whole`` class per GPU
    type with whole nodes, one ``shared`` class per type with shared nodes, and one ``mig``
    class per (type, profile) that some MIG GPU can host. Type indices follow ``GPU_NAMES``.
    """

    name: str
    nodes: tuple[Node, ...]
    catalogue: Mapping[str, GpuType]
    shared_slowdown: float
    price_usd_per_hour: np.ndarray  # (n_types,) aligned with GPU_NAMES
    type_capacity_mib: np.ndarray  # (n_types,)
    # per GPU
    gpu_type: np.ndarray  # int8 type index
    gpu_node: np.ndarray  # int32 node index
    gpu_mode: np.ndarray  # int8 MODE_*
    capacity_mib: np.ndarray  # int64
    max_shared: np.ndarray  # int32 (0 for non-shared GPUs)
    # per node
    node_type: np.ndarray
    node_mode: np.ndarray
    node_first: np.ndarray
    node_count: np.ndarray
    # MIG candidate instances (static layout entries and every valid dynamic placement)
    cand_gpu: np.ndarray
    cand_mask: np.ndarray  # int64 15-bit occupancy mask
    cand_class: np.ndarray  # option-class index
    cand_start: np.ndarray
    cand_order: np.ndarray  # tie-break rank within a GPU: smaller first
    # option classes
    class_kind: np.ndarray
    class_type: np.ndarray
    class_profile: tuple[str | None, ...]
    class_capacity_mib: np.ndarray
    class_price_usd_per_hour: np.ndarray  # per GPU of the class (MIG: compute share of its GPU)
    class_runtime_scale: np.ndarray
    class_compute_slices: np.ndarray
    _empty: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: PoolConfig) -> Pool:
        try:
            catalogue = with_prices(gpu_catalogue(), config.prices)
        except UnknownGpuError as exc:
            raise PoolError(f"pool {config.name!r}: {exc}") from None
        nodes: list[Node] = []
        first = 0
        for nc in config.nodes:
            if nc.gpu not in catalogue:
                raise PoolError(
                    f"node {nc.name!r}: unknown GPU type {nc.gpu!r}; use one of "
                    f"{', '.join(GPU_NAMES)}"
                )
            gpu = catalogue[nc.gpu]
            layout: tuple[tuple[tuple[str, int], ...], ...] | None = None
            if nc.mode == "mig":
                if nc.mig is None:
                    raise PoolError(
                        f"node {nc.name!r}: mode 'mig' needs a layout; set mig = \"dynamic\" or "
                        'a list of profiles per GPU such as [["3g.40gb", "4g.40gb"]]'
                    )
                if nc.mig != "dynamic":
                    layout = _static_layout(nc, gpu)
            elif nc.mig is not None:
                raise PoolError(
                    f"node {nc.name!r}: 'mig' is set but mode is {nc.mode!r}; set mode = \"mig\" "
                    "or remove the mig key"
                )
            nodes.append(
                Node(
                    name=nc.name,
                    gpu_type=nc.gpu,
                    count=nc.count,
                    mode=nc.mode,
                    first_gpu=first,
                    mig_layout=layout,
                    max_shared_jobs=nc.max_shared_jobs if nc.mode == "shared" else 1,
                )
            )
            first += nc.count
        return _build(config.name, tuple(nodes), catalogue, config.shared_slowdown)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pool:
        try:
            config = PoolConfig.model_validate(data)
        except ValidationError as exc:
            raise PoolError(_format_validation(exc, data)) from None
        return cls.from_config(config)

    def to_dict(self) -> dict[str, Any]:
        """A pool-file mapping that ``from_dict`` turns back into an equal pool."""
        nodes: list[dict[str, Any]] = []
        for n in self.nodes:
            d: dict[str, Any] = {"name": n.name, "gpu": n.gpu_type, "count": n.count}
            d["mode"] = n.mode
            if n.mode == "mig":
                d["mig"] = (
                    "dynamic"
                    if n.mig_layout is None
                    else [[f"{p}@{s}" for p, s in gpu] for gpu in n.mig_layout]
                )
            if n.mode == "shared":
                d["max_shared_jobs"] = n.max_shared_jobs
            nodes.append(d)
        defaults = gpu_catalogue()
        prices = {
            k: g.price_usd_per_hour
            for k, g in self.catalogue.items()
            if g.price_usd_per_hour != defaults[k].price_usd_per_hour
        }
        return {
            "name": self.name,
            "prices": prices,
            "shared_slowdown": self.shared_slowdown,
            "nodes": nodes,
        }

    # -- queries ------------------------------------------------------------------------------

    @property
    def n_gpus(self) -> int:
        return int(self.gpu_type.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.class_kind.shape[0])

    def types_present(self) -> tuple[str, ...]:
        present = set(np.unique(self.gpu_type).tolist())
        return tuple(n for i, n in enumerate(GPU_NAMES) if i in present)

    def price_for(self, gpu_type: str) -> float:
        return float(self.catalogue[gpu_type].price_usd_per_hour)

    def class_label(self, c: int) -> str:
        t = GPU_NAMES[int(self.class_type[c])]
        kind = int(self.class_kind[c])
        if kind == KIND_MIG:
            return f"{t} MIG {self.class_profile[c]}"
        if kind == KIND_SHARED:
            return f"shared {t}"
        return t

    def _indices(self) -> dict[str, np.ndarray]:
        """Index arrays the state summary reads, computed once per pool."""
        cached = self._empty.get("indices")
        if cached is None:
            whole_nodes = np.flatnonzero(self.node_mode == MODE_WHOLE)
            shared = np.flatnonzero(self.gpu_mode == MODE_SHARED)
            cached = {
                "whole_nodes": whole_nodes,
                "whole_node_type": self.node_type[whole_nodes].astype(np.int64),
                "shared_gpus": shared,
                "shared_type": self.gpu_type[shared].astype(np.int64),
                "class_whole": self.class_kind == KIND_WHOLE,
                "class_shared": self.class_kind == KIND_SHARED,
            }
            self._empty["indices"] = cached
        return cached  # type: ignore[no-any-return]

    def state(self) -> PoolState:
        """A fresh, empty state of this pool."""
        return PoolState(self)

    def empty_summary(self) -> Summary:
        cached = self._empty.get("summary")
        if cached is None:
            cached = self.state().summary()
            self._empty["summary"] = cached
        return cached  # type: ignore[no-any-return]

    def mig_instance(self, gpu: int, profile: str, start: int) -> tuple[int, int]:
        """(candidate index, slice memory MiB) of a MIG instance, or PlacementError."""
        t = GPU_NAMES[int(self.gpu_type[gpu])]
        hits = np.flatnonzero((self.cand_gpu == gpu) & (self.cand_start == start))
        for k in hits:
            c = int(self.cand_class[k])
            if self.class_profile[c] == profile:
                return int(k), int(self.class_capacity_mib[c])
        raise PlacementError(
            f"GPU {gpu} ({t}, node {self.nodes[int(self.gpu_node[gpu])].name!r}) has no MIG "
            f"instance {profile}@{start}; its layout or NVIDIA's placement rules forbid it"
        )


def _static_layout(nc: NodeConfig, gpu: GpuType) -> tuple[tuple[tuple[str, int], ...], ...]:
    assert nc.mig is not None and nc.mig != "dynamic"
    raw = nc.mig
    per_gpu: list[list[str]]
    if all(isinstance(x, str) for x in raw):
        per_gpu = [list(raw)] * nc.count  # type: ignore[arg-type]
    else:
        per_gpu = [list(x) for x in raw]  # type: ignore[arg-type]
        if len(per_gpu) != nc.count:
            raise PoolError(
                f"node {nc.name!r}: mig layout lists {len(per_gpu)} GPUs but count = {nc.count}; "
                "give one list per GPU or a single list for all"
            )
    out: list[tuple[tuple[str, int], ...]] = []
    for g, names in enumerate(per_gpu):
        wanted: list[tuple[MigProfile, int | None]] = []
        for item in names:
            name, sep, start_s = item.partition("@")
            try:
                prof = gpu.mig_profile(name.strip())
            except UnknownGpuError as exc:
                raise PoolError(f"node {nc.name!r} GPU {g}: {exc}") from None
            start: int | None = None
            if sep:
                try:
                    start = int(start_s)
                except ValueError:
                    raise PoolError(
                        f"node {nc.name!r} GPU {g}: bad MIG start {item!r}; write e.g. '1g.10gb@6'"
                    ) from None
                if start not in prof.placements:
                    raise PoolError(
                        f"node {nc.name!r} GPU {g}: {prof.name} cannot start at slot {start}; "
                        f"valid starts are {list(prof.placements)}"
                    )
            wanted.append((prof, start))
        placed = _place_layout(wanted)
        if placed is None:
            raise PoolError(
                f"node {nc.name!r} GPU {g}: MIG layout {names} does not fit one {gpu.name} "
                "under NVIDIA's placement rules (7 compute / 8 memory slices); drop or shrink "
                "a profile"
            )
        out.append(tuple(placed))
    return tuple(out)


def _place_layout(
    wanted: list[tuple[MigProfile, int | None]],
) -> list[tuple[str, int]] | None:
    """Assign start slots by depth-first search, biggest profiles first; None if impossible."""
    order = sorted(
        range(len(wanted)),
        key=lambda i: (-wanted[i][0].compute_slices, -wanted[i][0].memory_slices, i),
    )
    starts: dict[int, int] = {}

    def dfs(k: int, occ: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        prof, fixed = wanted[i]
        for s in (fixed,) if fixed is not None else prof.placements:
            m = mig_mask(prof, s)
            if occ & m == 0:
                starts[i] = s
                if dfs(k + 1, occ | m):
                    return True
        return False

    if not dfs(0, 0):
        return None
    return [(wanted[i][0].name, starts[i]) for i in range(len(wanted))]


def _build(
    name: str, nodes: tuple[Node, ...], catalogue: Mapping[str, GpuType], shared_slowdown: float
) -> Pool:
    type_index = {n: i for i, n in enumerate(GPU_NAMES)}
    n_gpus = sum(n.count for n in nodes)
    gpu_type = np.empty(n_gpus, np.int8)
    gpu_node = np.empty(n_gpus, np.int32)
    gpu_mode = np.empty(n_gpus, np.int8)
    max_shared = np.zeros(n_gpus, np.int32)
    type_cap = np.array(
        [math.floor(catalogue[t].memory_gib * MIB_PER_GIB) for t in GPU_NAMES], np.int64
    )
    prices = np.array([catalogue[t].price_usd_per_hour for t in GPU_NAMES], np.float64)
    for k, n in enumerate(nodes):
        sl = slice(n.first_gpu, n.first_gpu + n.count)
        gpu_type[sl] = type_index[n.gpu_type]
        gpu_node[sl] = k
        gpu_mode[sl] = _MODE_CODES[n.mode]
        if n.mode == "shared":
            max_shared[sl] = n.max_shared_jobs
    capacity = type_cap[gpu_type.astype(np.int64)]

    # Option classes in a fixed order: by type, then whole, shared, MIG profiles by size.
    cls_kind: list[int] = []
    cls_type: list[int] = []
    cls_prof: list[str | None] = []
    cls_cap: list[int] = []
    cls_price: list[float] = []
    cls_scale: list[float] = []
    cls_slices: list[int] = []
    class_of: dict[tuple[int, str | None], int] = {}
    mig_profiles_used: dict[int, set[str]] = {}
    for n in nodes:
        if n.mode != "mig":
            continue
        used = mig_profiles_used.setdefault(type_index[n.gpu_type], set())
        if n.mig_layout is None:
            used.update(p.name for p in catalogue[n.gpu_type].mig_profiles)
        else:
            used.update(p for gpu in n.mig_layout for p, _ in gpu)
    for t, tname in enumerate(GPU_NAMES):
        modes = {n.mode for n in nodes if n.gpu_type == tname}
        price = float(prices[t])
        for kind_name, kind in (("whole", KIND_WHOLE), ("shared", KIND_SHARED)):
            if kind_name in modes:
                class_of[(kind, tname)] = len(cls_kind)
                cls_kind.append(kind)
                cls_type.append(t)
                cls_prof.append(None)
                cls_cap.append(int(type_cap[t]))
                cls_price.append(price)
                cls_scale.append(1.0 if kind == KIND_WHOLE else shared_slowdown)
                cls_slices.append(MIG_COMPUTE_SLICES)
        for prof in catalogue[tname].mig_profiles:
            if prof.name not in mig_profiles_used.get(t, set()):
                continue
            class_of[(KIND_MIG, f"{tname}/{prof.name}")] = len(cls_kind)
            cls_kind.append(KIND_MIG)
            cls_type.append(t)
            cls_prof.append(prof.name)
            cls_cap.append(int(type_cap[t]) * prof.memory_slices // MIG_MEMORY_SLICES)
            # A slice has compute_slices/7 of the SMs, so it is billed that share of the GPU and
            # a job runs 7/compute_slices times longer on it (conservative for memory-bound work).
            cls_price.append(price * prof.compute_slices / MIG_COMPUTE_SLICES)
            cls_scale.append(MIG_COMPUTE_SLICES / prof.compute_slices)
            cls_slices.append(prof.compute_slices)

    c_gpu: list[int] = []
    c_mask: list[int] = []
    c_class: list[int] = []
    c_start: list[int] = []
    c_order: list[int] = []
    for n in nodes:
        if n.mode != "mig":
            continue
        gt = catalogue[n.gpu_type]
        for g_local in range(n.count):
            g = n.first_gpu + g_local
            if n.mig_layout is None:
                insts = [(p.name, s) for p in gt.mig_profiles for s in p.placements]
            else:
                insts = list(n.mig_layout[g_local])
            for pname, s in insts:
                prof = gt.mig_profile(pname)
                c_gpu.append(g)
                c_mask.append(mig_mask(prof, s))
                c_class.append(class_of[(KIND_MIG, f"{n.gpu_type}/{pname}")])
                c_start.append(s)
                # Small slices go to the highest free start so slot 0 stays open for 4g/7g.
                c_order.append(-s if prof.compute_slices < 4 else s)

    node_type = np.array([type_index[n.gpu_type] for n in nodes], np.int8)
    node_mode = np.array([_MODE_CODES[n.mode] for n in nodes], np.int8)
    return Pool(
        name=name,
        nodes=nodes,
        catalogue=dict(catalogue),
        shared_slowdown=shared_slowdown,
        price_usd_per_hour=prices,
        type_capacity_mib=type_cap,
        gpu_type=gpu_type,
        gpu_node=gpu_node,
        gpu_mode=gpu_mode,
        capacity_mib=capacity,
        max_shared=max_shared,
        node_type=node_type,
        node_mode=node_mode,
        node_first=np.array([n.first_gpu for n in nodes], np.int64),
        node_count=np.array([n.count for n in nodes], np.int64),
        cand_gpu=np.array(c_gpu, np.int64),
        cand_mask=np.array(c_mask, np.int64),
        cand_class=np.array(c_class, np.int64),
        cand_start=np.array(c_start, np.int64),
        cand_order=np.array(c_order, np.int64),
        class_kind=np.array(cls_kind, np.int8),
        class_type=np.array(cls_type, np.int64),
        class_profile=tuple(cls_prof),
        class_capacity_mib=np.array(cls_cap, np.int64),
        class_price_usd_per_hour=np.array(cls_price, np.float64),
        class_runtime_scale=np.array(cls_scale, np.float64),
        class_compute_slices=np.array(cls_slices, np.int64),
    )


def _format_validation(exc: ValidationError, data: Mapping[str, Any]) -> str:
    parts = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(x) for x in loc)
        if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
            try:
                node_name = data["nodes"][loc[1]].get("name", f"#{loc[1]}")
            except (KeyError, IndexError, TypeError, AttributeError):
                node_name = f"#{loc[1]}"
            where = f"node {node_name!r} field {'.'.join(str(x) for x in loc[2:]) or '(node)'}"
        parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "invalid pool: " + "; ".join(parts)


def load_pool(path: str | Path) -> Pool:
    """Read a pool TOML file (see ``datasets/pools/mixed.toml`` for the format)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PoolError(f"pool file {str(p)!r} does not exist; pass a TOML pool file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PoolError(f"pool file {str(p)!r} is not valid TOML: {exc}") from None
    data.setdefault("name", p.stem)
    return Pool.from_dict(data)


def synthetic_pool(
    n_gpus: int,
    seed: int = 0,
    *,
    gpus_per_node: int = 8,
    mig_fraction: float = 0.0625,
    shared_fraction: float = 0.0625,
) -> Pool:
    """A big mixed pool for benchmarks: ``n_gpus`` GPUs in nodes of ``gpus_per_node``.

    Types are drawn with fleet-like weights (many A100s and H100s, fewer H200/B200); about
    ``mig_fraction`` of nodes are dynamic-MIG A100-80GB/H100 nodes and ``shared_fraction`` are
    shared (MPS) nodes. Same seed, same pool.
    """
    if n_gpus < gpus_per_node or n_gpus % gpus_per_node:
        raise PoolError(
            f"synthetic_pool needs n_gpus as a positive multiple of {gpus_per_node}; got {n_gpus}"
        )
    rng = np.random.default_rng(seed)
    n_nodes = n_gpus // gpus_per_node
    weights = np.array([0.20, 0.25, 0.30, 0.15, 0.10])
    types = rng.choice(len(GPU_NAMES), size=n_nodes, p=weights)
    modes = rng.choice(
        3, size=n_nodes, p=[1 - mig_fraction - shared_fraction, mig_fraction, shared_fraction]
    )
    nodes: list[dict[str, Any]] = []
    for k in range(n_nodes):
        t = GPU_NAMES[int(types[k])]
        mode = ("whole", "mig", "shared")[int(modes[k])]
        node: dict[str, Any] = {"name": f"n{k:05d}", "gpu": t, "count": gpus_per_node}
        node["mode"] = mode
        if mode == "mig":
            node["mig"] = "dynamic"
        nodes.append(node)
    return Pool.from_dict({"name": f"synthetic-{n_gpus}-s{seed}", "nodes": nodes})


# ---------------------------------------------------------------------------------------------
# Mutable state


class TypeFree(NamedTuple):
    gpus: int
    idle_gpus: int
    free_gib: float


@dataclass(frozen=True, slots=True)
class _Alloc:
    option: Option
    kind: int
    gpus: tuple[int, ...]
    used_mib: int  # memory taken from each GPU
    reserved_mib: int  # the job's reservation on each GPU
    mig_mask: int


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-state aggregates that option enumeration reads (computed once per state version)."""

    node_free: np.ndarray  # idle GPUs per node (only read for whole-mode nodes)
    type_max_node_free: np.ndarray  # (n_types,) most idle whole GPUs in one node
    type_shared_free_mib: np.ndarray  # (n_types,) most free MiB on an open shared GPU
    class_avail: np.ndarray  # (n_classes,) MIG instances creatable now (0 for other kinds)
    mig_avail: np.ndarray  # (n_cands,) bool
    # (n_classes,) what each option class can supply now, compared against a job's demand:
    # whole -> most idle GPUs in one node, shared -> most free MiB on an open GPU, MIG -> free
    # instances. One comparison per job then answers "fits now" for every class.
    class_supply: np.ndarray


class PoolState:
    """What is taken on every GPU right now. Cheap to copy; ``release`` undoes ``allocate``.

    Arrays (one entry per GPU, aligned with ``pool.gpu_*``): ``used_mib`` (memory no one else
    can take: a whole GPU, MIG slices, shared reservations), ``reserved_mib`` (sum of job
    reservations), ``busy`` (a whole-GPU job holds it), ``mig_occ`` (15-bit slice mask),
    ``shared_count`` (jobs on a shared GPU).
    """

    __slots__ = (
        "_allocs",
        "_dirty",
        "_summary",
        "_summary_version",
        "busy",
        "mig_occ",
        "pool",
        "reserved_mib",
        "shared_count",
        "used_mib",
        "version",
    )

    def __init__(self, pool: Pool) -> None:
        n = pool.n_gpus
        self.pool = pool
        self.used_mib = np.zeros(n, np.int64)
        self.reserved_mib = np.zeros(n, np.int64)
        self.busy = np.zeros(n, bool)
        self.mig_occ = np.zeros(n, np.int64)
        self.shared_count = np.zeros(n, np.int32)
        self._allocs: dict[str, _Alloc] = {}
        self.version = 0
        self._summary: Summary | None = None
        self._summary_version = -1
        self._dirty = 0

    # -- views --------------------------------------------------------------------------------

    @property
    def free_mib(self) -> np.ndarray:
        return self.pool.capacity_mib - self.used_mib

    @property
    def free_gib(self) -> np.ndarray:
        """Per-GPU memory nobody holds (0 on a whole-GPU job's GPU), GiB."""
        return self.free_mib / MIB_PER_GIB

    @property
    def capacity_gib(self) -> np.ndarray:
        return self.pool.capacity_mib / MIB_PER_GIB

    @property
    def idle(self) -> np.ndarray:
        """GPUs with nothing on them."""
        return self.used_mib == 0

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(self._allocs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._allocs

    def __len__(self) -> int:
        return len(self._allocs)

    def option_of(self, job_id: str) -> Option:
        try:
            return self._allocs[job_id].option
        except KeyError:
            raise PlacementError(f"job {job_id!r} holds nothing in this pool") from None

    def allocations(self) -> dict[str, Option]:
        return {j: a.option for j, a in self._allocs.items()}

    def free_by_type(self) -> dict[str, TypeFree]:
        out: dict[str, TypeFree] = {}
        idle = self.idle
        free = self.free_mib
        for t, name in enumerate(GPU_NAMES):
            m = self.pool.gpu_type == t
            if not m.any():
                continue
            out[name] = TypeFree(
                gpus=int(m.sum()),
                idle_gpus=int((idle & m).sum()),
                free_gib=float(free[m].sum()) / MIB_PER_GIB,
            )
        return out

    def copy(self) -> PoolState:
        new = PoolState.__new__(PoolState)
        new.pool = self.pool
        new.used_mib = self.used_mib.copy()
        new.reserved_mib = self.reserved_mib.copy()
        new.busy = self.busy.copy()
        new.mig_occ = self.mig_occ.copy()
        new.shared_count = self.shared_count.copy()
        new._allocs = dict(self._allocs)
        new.version = self.version
        new._summary = self._summary
        new._summary_version = self._summary_version
        new._dirty = self._dirty
        return new

    def fenced(self, gpu_indices: Iterable[int]) -> PoolState:
        """A copy in which the given GPUs take nothing new (a backfill reservation's shadow)."""
        new = self.copy()
        idx = np.fromiter(gpu_indices, np.int64)
        new.busy[idx] = True
        new.used_mib[idx] = self.pool.capacity_mib[idx]
        new.mig_occ[idx] = (1 << 15) - 1
        new.shared_count[idx] = np.maximum(self.pool.max_shared[idx], new.shared_count[idx])
        new._summary = None
        new._summary_version = -1
        new._dirty = _ALL_KINDS
        return new

    # -- aggregates for enumeration ------------------------------------------------------------

    def summary(self) -> Summary:
        if self._summary is not None and self._summary_version == self.version:
            return self._summary
        p = self.pool
        prev = self._summary
        dirty = self._dirty if prev is not None else _ALL_KINDS
        idx = p._indices()
        ct = p.class_type
        if prev is None or dirty & _DIRTY_WHOLE:
            # Nodes are contiguous GPU ranges, so per-node sums are one reduceat.
            free_whole = (~self.busy & (self.used_mib == 0)).astype(np.int64)
            node_free = np.add.reduceat(free_whole, p.node_first) if len(p.nodes) else free_whole
            tmax = np.zeros(len(GPU_NAMES), np.int64)
            np.maximum.at(tmax, idx["whole_node_type"], node_free[idx["whole_nodes"]])
        else:
            node_free, tmax = prev.node_free, prev.type_max_node_free
        if prev is None or dirty & _DIRTY_SHARED:
            g = idx["shared_gpus"]
            shared_free = np.full(len(GPU_NAMES), -1, np.int64)
            if g.size:
                open_ = self.shared_count[g] < p.max_shared[g]
                free = np.where(open_, p.capacity_mib[g] - self.used_mib[g], -1)
                np.maximum.at(shared_free, idx["shared_type"], free)
        else:
            shared_free = prev.type_shared_free_mib
        if prev is None or dirty & _DIRTY_MIG:
            if p.cand_gpu.size:
                avail = (self.mig_occ[p.cand_gpu] & p.cand_mask) == 0
                class_avail = np.bincount(p.cand_class[avail], minlength=p.n_classes)
            else:
                avail = np.zeros(0, bool)
                class_avail = np.zeros(p.n_classes, np.int64)
        else:
            avail, class_avail = prev.mig_avail, prev.class_avail
        supply = np.where(
            idx["class_whole"],
            tmax[ct],
            np.where(idx["class_shared"], shared_free[ct], class_avail),
        )
        self._summary = Summary(node_free, tmax, shared_free, class_avail, avail, supply)
        self._summary_version = self.version
        self._dirty = 0
        return self._summary

    # -- mutation -----------------------------------------------------------------------------

    def allocate(self, option: Option, job_id: str) -> None:
        """Commit ``option`` for ``job_id``; PlacementError (and no change) if it is not free."""
        if job_id in self._allocs:
            raise PlacementError(f"job {job_id!r} already holds GPUs; release it first")
        p = self.pool
        gpus = tuple(int(g) for g in option.gpu_indices)
        if not gpus:
            raise PlacementError(
                f"job {job_id!r}: option {option.label} names no GPUs (it does not fit now)"
            )
        idx = np.array(gpus, np.int64)
        if idx.min() < 0 or idx.max() >= p.n_gpus or len(set(gpus)) != len(gpus):
            raise PlacementError(f"job {job_id!r}: GPU indices {gpus} are invalid for this pool")
        type_name = GPU_NAMES[int(p.gpu_type[gpus[0]])]
        if (p.gpu_type[idx] != p.gpu_type[gpus[0]]).any() or type_name != option.gpu_type:
            raise PlacementError(
                f"job {job_id!r}: GPUs {gpus} are not all {option.gpu_type}; pool has "
                f"{[GPU_NAMES[int(t)] for t in p.gpu_type[idx]]}"
            )
        res = gib_to_mib_ceil(option.reserved_gib)
        mode = _MODE_CODES[option.kind]
        if (p.gpu_mode[idx] != mode).any():
            node = p.nodes[int(p.gpu_node[gpus[0]])]
            raise PlacementError(
                f"job {job_id!r}: a {option.kind} option cannot go on node {node.name!r} "
                f"(mode {node.mode!r})"
            )
        mask = 0
        if mode == MODE_WHOLE:
            if self.busy[idx].any() or self.used_mib[idx].any():
                raise PlacementError(f"job {job_id!r}: GPUs {gpus} are not all idle")
            cap = int(p.capacity_mib[gpus[0]])
            if res > cap:
                raise PlacementError(
                    f"job {job_id!r}: reservation {res} MiB exceeds a {type_name} ({cap} MiB)"
                )
            used = cap
            self.busy[idx] = True
        elif mode == MODE_MIG:
            if len(gpus) != 1 or option.mig_profile is None or option.mig_start is None:
                raise PlacementError(
                    f"job {job_id!r}: a MIG option needs one GPU, a profile and a start slot"
                )
            k, used = p.mig_instance(gpus[0], option.mig_profile, option.mig_start)
            mask = int(p.cand_mask[k])
            if int(self.mig_occ[gpus[0]]) & mask:
                raise PlacementError(
                    f"job {job_id!r}: MIG {option.mig_profile}@{option.mig_start} on GPU "
                    f"{gpus[0]} overlaps a slice in use"
                )
            if res > used:
                raise PlacementError(
                    f"job {job_id!r}: reservation {res} MiB exceeds MIG {option.mig_profile} "
                    f"({used} MiB)"
                )
            self.mig_occ[gpus[0]] |= mask
        else:
            g = gpus[0]
            if len(gpus) != 1:
                raise PlacementError(f"job {job_id!r}: a shared option takes exactly one GPU")
            if self.shared_count[g] >= p.max_shared[g]:
                raise PlacementError(
                    f"job {job_id!r}: shared GPU {g} already runs {int(self.shared_count[g])} "
                    f"jobs (max_shared_jobs = {int(p.max_shared[g])})"
                )
            free = int(p.capacity_mib[g] - self.used_mib[g])
            if res > free:
                raise PlacementError(
                    f"job {job_id!r}: shared GPU {g} has {free} MiB free, needs {res} MiB"
                )
            used = res
            self.shared_count[g] += 1
        self.used_mib[idx] += used
        self.reserved_mib[idx] += res
        self._allocs[job_id] = _Alloc(option, mode, gpus, used, res, mask)
        self.version += 1
        self._dirty |= 1 << mode

    def release(self, job_id: str) -> Option:
        """Undo ``allocate`` exactly; returns the option the job held."""
        try:
            a = self._allocs.pop(job_id)
        except KeyError:
            raise PlacementError(
                f"job {job_id!r} holds nothing in this pool; it was never placed or was "
                "already released"
            ) from None
        idx = np.array(a.gpus, np.int64)
        self.used_mib[idx] -= a.used_mib
        self.reserved_mib[idx] -= a.reserved_mib
        if a.kind == MODE_WHOLE:
            self.busy[idx] = False
        elif a.kind == MODE_MIG:
            self.mig_occ[a.gpus[0]] &= ~a.mig_mask
        else:
            self.shared_count[a.gpus[0]] -= 1
        self.version += 1
        self._dirty |= 1 << a.kind
        return a.option

    @classmethod
    def from_allocations(cls, pool: Pool, allocations: Mapping[str, Option]) -> PoolState:
        """Rebuild a state from stored placements (e.g. after a scheduler restart)."""
        state = cls(pool)
        for job_id, option in allocations.items():
            state.allocate(option, job_id)
        return state

    def assert_consistent(self) -> None:
        """Recompute everything from the allocations; PoolError on any mismatch or overcommit."""
        p = self.pool
        n = p.n_gpus
        used = np.zeros(n, np.int64)
        reserved = np.zeros(n, np.int64)
        busy = np.zeros(n, bool)
        occ = np.zeros(n, np.int64)
        count = np.zeros(n, np.int32)
        problems: list[str] = []
        for job_id, a in self._allocs.items():
            for g in a.gpus:
                used[g] += a.used_mib
                reserved[g] += a.reserved_mib
                if a.kind == MODE_WHOLE:
                    if busy[g]:
                        problems.append(f"GPU {g} is held by two whole-GPU jobs (one is {job_id})")
                    busy[g] = True
                    if a.reserved_mib > p.capacity_mib[g]:
                        problems.append(f"job {job_id} reserves more than GPU {g} holds")
                elif a.kind == MODE_MIG:
                    if occ[g] & a.mig_mask:
                        problems.append(f"MIG slices overlap on GPU {g} (job {job_id})")
                    occ[g] |= a.mig_mask
                    if a.reserved_mib > a.used_mib:
                        problems.append(f"job {job_id} reserves more than its MIG slice")
                else:
                    count[g] += 1
                if gib_to_mib_ceil(a.option.reserved_gib) != a.reserved_mib:
                    problems.append(f"job {job_id}: stored reservation differs from its option")
        for name, want, have in (
            ("used_mib", used, self.used_mib),
            ("reserved_mib", reserved, self.reserved_mib),
            ("busy", busy, self.busy),
            ("mig_occ", occ, self.mig_occ),
            ("shared_count", count, self.shared_count),
        ):
            bad = np.flatnonzero(want != have)
            if bad.size:
                problems.append(f"{name} disagrees with the allocations on GPUs {bad[:8].tolist()}")
        over = np.flatnonzero(self.used_mib > p.capacity_mib)
        if over.size:
            problems.append(f"GPUs {over[:8].tolist()} are over-committed")
        if (self.reserved_mib > self.used_mib).any():
            problems.append("some GPU holds more reservations than memory taken")
        if (self.shared_count > np.maximum(p.max_shared, 0)).any():
            problems.append("some shared GPU exceeds max_shared_jobs")
        if problems:
            raise PoolError("pool state is inconsistent: " + "; ".join(problems))


def popcount15(masks: np.ndarray) -> np.ndarray:
    return _POPCOUNT[masks & ((1 << 15) - 1)]


def ensure_types(names: Sequence[str]) -> None:
    for n in names:
        if n not in GPU_NAMES:
            raise PoolError(f"unknown GPU type {n!r}; use one of {', '.join(GPU_NAMES)}")
