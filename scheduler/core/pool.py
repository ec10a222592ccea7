"""The GPU pool: nodes of one GPU type each, whole / MIG / shared, and its mutable state.

A :class:`Pool` is the static description (loaded from TOML through pydantic, then flattened to
numpy arrays, one entry per GPU). A :class:`PoolState` is what is taken right now; it is plain
numpy so placement can scan a 10,000-GPU pool per job in microseconds.

Memory is accounted in whole MiB (``int64``): capacities are floored and reservations ceiled to
a MiB, so ``allocate`` followed by ``release`` restores every array bit for bit, and a
reservation is never below the predicted bound it came from.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from predictor._node_selector import check_labels
from predictor.exceptions import UnknownGpuError
from predictor.gpus import GPU_NAMES, GpuType, gpu_catalogue, with_prices
from predictor.limits import MAX_CPUS, MAX_HOST_MEMORY_GIB
from scheduler.core import mig as _mig
from scheduler.core._host_defaults import HOST_PER_GPU
from scheduler.core.mig import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, mig_mask, static_layout
from scheduler.exceptions import PlacementError, PoolError

if TYPE_CHECKING:
    from scheduler.core.state import PoolState, Summary

__all__ = [
    "DEFAULT_NETWORK_GBPS",
    "KIND_MIG",
    "KIND_NAMES",
    "KIND_SHARED",
    "KIND_WHOLE",
    "MIB_PER_GIB",
    "MILLI_PER_CPU",
    "MODE_MIG",
    "MODE_SHARED",
    "MODE_WHOLE",
    "Node",
    "NodeConfig",
    "Pool",
    "PoolConfig",
    "gib_to_mib_ceil",
    "load_pool",
]


MIB_PER_GIB = 1024


#: A node's inter-node bandwidth when the pool file names none: one 400 Gb/s InfiniBand (NDR)
#: link, the bound a gang's cross-node all-reduce is charged at.
DEFAULT_NETWORK_GBPS = 400.0


#: CPUs are accounted in thousandths of a core (Kubernetes millicores), ``int64``.
MILLI_PER_CPU = 1000


MODE_WHOLE, MODE_MIG, MODE_SHARED = 0, 1, 2


MODE_CODES: dict[str, int] = {"whole": MODE_WHOLE, "mig": MODE_MIG, "shared": MODE_SHARED}


# Option classes (columns of the per-job option vector) use the same codes as node modes.
KIND_WHOLE, KIND_MIG, KIND_SHARED = MODE_WHOLE, MODE_MIG, MODE_SHARED


KIND_NAMES: tuple[Literal["whole", "mig", "shared"], ...] = ("whole", "mig", "shared")


def gib_to_mib_ceil(gib: float) -> int:
    """Reservations round *up* to a MiB so they never drop below the bound they came from."""
    # Scaling by 1024 is exact in binary floating point, so k/1024 GiB maps to exactly k MiB.
    return math.ceil(gib * MIB_PER_GIB)


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
    # Shared nodes only: idle GPUs may also go whole, to whole-GPU jobs and gangs (as a
    # Kubernetes GPU-share node serves both; the openb trace's nodes are such nodes).
    whole_gpus: bool = False
    # Host resources; omitted: the GPU type's typical figure per GPU x count
    # (scheduler/core/_host_defaults.py, from NVIDIA's DGX datasheets).
    cpus: float | None = Field(default=None, ge=0.001, le=MAX_CPUS, allow_inf_nan=False)
    host_memory_gib: float | None = Field(
        default=None, gt=0, le=MAX_HOST_MEMORY_GIB, allow_inf_nan=False
    )
    # Multi-node gangs (scheduler/core/gang.py): the rack or NVLink domain the node sits in
    # (placement prefers fewer racks; nodes without one share one unnamed rack) and the node's
    # inter-node network bandwidth, which the gang's all-reduce runs over.
    rack: str | None = Field(default=None, min_length=1, max_length=100)
    network_gbps: float = Field(default=DEFAULT_NETWORK_GBPS, gt=0, le=100_000, allow_inf_nan=False)
    # Labels a job's node_selector matches (scheduler/core/selector.py), e.g.
    # {"gpu-model" = "V100M16"}; Kubernetes' key and value syntax.
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        check_labels(v)
        return v


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
    cpus: float = 0.0
    host_memory_gib: float = 0.0
    whole_gpus: bool = False
    rack: str | None = None
    network_gbps: float = DEFAULT_NETWORK_GBPS
    #: (key, value) pairs sorted by key (a tuple, so nodes stay hashable): what a job's
    #: node_selector matches.
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def gpu_indices(self) -> range:
        return range(self.first_gpu, self.first_gpu + self.count)

    @property
    def mig_dynamic(self) -> bool:
        return self.mode == "mig" and self.mig_layout is None

    @property
    def serves_whole(self) -> bool:
        """Whether whole-GPU options may land here (whole nodes, and shared ones that say so)."""
        return self.mode == "whole" or self.whole_gpus


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
    node_cpu_milli: np.ndarray  # int64 CPU capacity in millicores
    node_host_mib: np.ndarray  # int64 host memory capacity, MiB
    node_whole: np.ndarray  # bool: whole-GPU options may land here (Node.serves_whole)
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
                    layout = static_layout(nc, gpu)
            elif nc.mig is not None:
                raise PoolError(
                    f"node {nc.name!r}: 'mig' is set but mode is {nc.mode!r}; set mode = \"mig\" "
                    "or remove the mig key"
                )
            if nc.whole_gpus and nc.mode != "shared":
                raise PoolError(
                    f'node {nc.name!r}: whole_gpus = true needs mode = "shared" (got '
                    f"{nc.mode!r}); a whole node serves whole GPUs already"
                )
            cpus_per_gpu, host_per_gpu = HOST_PER_GPU[nc.gpu]
            nodes.append(
                Node(
                    name=nc.name,
                    gpu_type=nc.gpu,
                    count=nc.count,
                    mode=nc.mode,
                    first_gpu=first,
                    mig_layout=layout,
                    max_shared_jobs=nc.max_shared_jobs if nc.mode == "shared" else 1,
                    cpus=nc.cpus if nc.cpus is not None else cpus_per_gpu * nc.count,
                    host_memory_gib=(
                        nc.host_memory_gib
                        if nc.host_memory_gib is not None
                        else host_per_gpu * nc.count
                    ),
                    whole_gpus=nc.whole_gpus,
                    rack=nc.rack,
                    network_gbps=nc.network_gbps,
                    labels=tuple(sorted(nc.labels.items())),
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
                if n.whole_gpus:
                    d["whole_gpus"] = True
            d["cpus"] = n.cpus
            d["host_memory_gib"] = n.host_memory_gib
            # Only when set, so pools without racks keep their fingerprint.
            if n.rack is not None:
                d["rack"] = n.rack
            if n.network_gbps != DEFAULT_NETWORK_GBPS:
                d["network_gbps"] = n.network_gbps
            if n.labels:
                d["labels"] = dict(n.labels)
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
            whole_nodes = np.flatnonzero(self.node_whole)
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
        from scheduler.core.state import PoolState

        return PoolState(self)

    def empty_summary(self) -> Summary:
        cached = self._empty.get("summary")
        if cached is None:
            cached = self.state().summary()
            self._empty["summary"] = cached
        return cached  # type: ignore[no-any-return]

    def mig_instance(self, gpu: int, profile: str, start: int) -> tuple[int, int]:
        """(candidate index, slice memory MiB) of a MIG instance, or PlacementError."""
        memo = self._empty.get("mig_instances")
        if memo is None:
            memo = self._empty["mig_instances"] = _mig.mig_instances(self)
        got: tuple[int, int] | None = memo.get((int(gpu), profile, int(start)))
        if got is None:
            t = GPU_NAMES[int(self.gpu_type[gpu])]
            raise PlacementError(
                f"GPU {gpu} ({t}, node {self.nodes[int(self.gpu_node[gpu])].name!r}) has no MIG "
                f"instance {profile}@{start}; its layout or NVIDIA's placement rules forbid it"
            )
        return got


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
        gpu_mode[sl] = MODE_CODES[n.mode]
        if n.mode == "shared":
            max_shared[sl] = n.max_shared_jobs
    capacity = type_cap[gpu_type.astype(np.int64)]
    classes, class_of = _option_classes(nodes, catalogue, type_cap, prices, shared_slowdown)
    cands = _mig_candidates(nodes, catalogue, class_of)
    node_type = np.array([type_index[n.gpu_type] for n in nodes], np.int8)
    node_mode = np.array([MODE_CODES[n.mode] for n in nodes], np.int8)
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
        # Floored, like GPU memory: a node never promises more than it has.
        node_cpu_milli=np.array(
            [math.floor(n.cpus * MILLI_PER_CPU + 1e-6) for n in nodes], np.int64
        ),
        node_host_mib=np.array(
            [math.floor(n.host_memory_gib * MIB_PER_GIB + 1e-6) for n in nodes], np.int64
        ),
        node_whole=np.array([n.serves_whole for n in nodes], bool),
        **cands,
        **classes,
    )


def _option_classes(
    nodes: tuple[Node, ...],
    catalogue: Mapping[str, GpuType],
    type_cap: np.ndarray,
    prices: np.ndarray,
    shared_slowdown: float,
) -> tuple[dict[str, Any], dict[tuple[int, str | None], int]]:
    """The pool's option classes (``class_*`` fields of :class:`Pool`) and their index by
    (kind, type or type/profile)."""
    type_index = {n: i for i, n in enumerate(GPU_NAMES)}
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
        modes |= {"whole" for n in nodes if n.gpu_type == tname and n.whole_gpus}
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

    classes = {
        "class_kind": np.array(cls_kind, np.int8),
        "class_type": np.array(cls_type, np.int64),
        "class_profile": tuple(cls_prof),
        "class_capacity_mib": np.array(cls_cap, np.int64),
        "class_price_usd_per_hour": np.array(cls_price, np.float64),
        "class_runtime_scale": np.array(cls_scale, np.float64),
        "class_compute_slices": np.array(cls_slices, np.int64),
    }
    return classes, class_of


def _mig_candidates(
    nodes: tuple[Node, ...],
    catalogue: Mapping[str, GpuType],
    class_of: Mapping[tuple[int, str | None], int],
) -> dict[str, Any]:
    """Every MIG instance that may exist (``cand_*`` fields of :class:`Pool`)."""
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
    return {
        "cand_gpu": np.array(c_gpu, np.int64),
        "cand_mask": np.array(c_mask, np.int64),
        "cand_class": np.array(c_class, np.int64),
        "cand_start": np.array(c_start, np.int64),
        "cand_order": np.array(c_order, np.int64),
    }


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


def ensure_types(names: Sequence[str]) -> None:
    for n in names:
        if n not in GPU_NAMES:
            raise PoolError(f"unknown GPU type {n!r}; use one of {', '.join(GPU_NAMES)}")
