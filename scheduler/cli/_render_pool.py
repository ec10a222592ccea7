"""``snugfit pool``'s GPU view: per node and GPU who runs where, reserved against used VRAM and
the MIG layout, then the free capacity by GPU type (the CPU and host-memory table between them is
:mod:`scheduler.cli._render_host`).

Pure, like :mod:`scheduler.cli.render`, which re-exports :func:`pool_view` and
:func:`free_by_type`: stored allocation records in, rich renderables or dicts out. Both views
read the pool through :func:`stored_state`, the state the stored allocations describe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from scheduler.cli._render_host import host_table
from scheduler.core.decision import Option
from scheduler.core.mig import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES
from scheduler.core.pool import MIB_PER_GIB, MODE_MIG, MODE_SHARED, Pool
from scheduler.core.state import PoolState

__all__ = ["free_by_type", "pool_view", "stored_state"]


def _mib_gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f}"


def pool_view(
    pool: Pool,
    allocations: Mapping[str, Mapping[str, Any]],
    *,
    peaks_gib: Mapping[str, float] | None = None,
    nodes_alive: Mapping[str, bool] | None = None,
    node_states: Mapping[str, str] | None = None,
    group_rows: bool = True,
) -> RenderableType:
    """Per node and GPU: who runs where, reserved vs used VRAM, MIG layout; free by type.

    ``group_rows=False`` repeats the node, type and mode on every GPU's row (for tab-separated
    output, where each line must stand alone for ``grep``/``cut``).

    ``allocations`` are ``P:allocs`` values (job id -> allocation JSON). ``peaks_gib`` gives a
    job's measured (or, while running, predicted) per-GPU VRAM; without it "used" is the
    prediction stored in the option. ``node_states`` labels each node (``up``, ``down``,
    ``unknown``, ``up, cordoned`` ...).
    """
    peaks = peaks_gib or {}
    per_gpu: dict[int, list[tuple[str, Mapping[str, Any]]]] = {}
    for jid, alloc in allocations.items():
        opt = alloc.get("option") or {}
        for g in alloc.get("gpus") or opt.get("gpu_indices") or ():
            per_gpu.setdefault(int(g), []).append((jid, alloc))
    state = stored_state(pool, allocations)
    table = Table(title=f"pool {pool.name}: {pool.n_gpus} GPUs", title_justify="left")
    for col, just in (
        ("node", "left"),
        ("gpu", "right"),
        ("type", "left"),
        ("mode", "left"),
        ("reserved/cap GiB", "right"),
        ("used GiB", "right"),
        ("jobs / MIG layout", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for node in pool.nodes:
        alive = "" if nodes_alive is None else (" ●" if nodes_alive.get(node.name) else " ○")
        if node_states is not None and node.name in node_states:
            alive += f" ({node_states[node.name]})"
        for k, g in enumerate(node.gpu_indices):
            cap_mib = int(pool.capacity_mib[g])
            held = per_gpu.get(g, [])
            reserved = sum(int(a.get("reserved_mib", 0)) for _, a in held)
            used_gib = 0.0
            for jid, a in held:
                o = a.get("option") or {}
                used_gib += float(peaks.get(jid, o.get("vram_gib") or 0.0))
            first = k == 0 or not group_rows
            table.add_row(
                (node.name + alive) if first else "",
                str(g),
                node.gpu_type if first else "",
                node.mode if first else "",
                f"{_mib_gib(reserved)}/{_mib_gib(cap_mib)}",
                f"{used_gib:.1f}" if held else "-",
                _gpu_cell(pool, g, held, int(state.mig_occ[g])),
                end_section=k == node.count - 1,
            )
    free = Table(title="free capacity by type", title_justify="left")
    for col in ("type", "GPUs", "idle", "free GiB", "price $/GPU-h"):
        free.add_column(col, justify="left" if col == "type" else "right")
    for name, tf in free_by_type(pool, allocations, state=state).items():
        free.add_row(
            name,
            str(tf["gpus"]),
            str(tf["idle_gpus"]),
            f"{tf['free_gib']:,.1f}",
            f"{tf['price_usd_per_hour']:.2f}",
        )
    return Group(table, host_table(pool, state), free)


def stored_state(pool: Pool, allocations: Mapping[str, Mapping[str, Any]]) -> PoolState:
    """The pool state the stored allocations describe (malformed or clashing ones skipped)."""
    state = pool.state()
    for jid, alloc in allocations.items():
        try:
            state.allocate(Option.from_dict(alloc.get("option") or {}), jid)
        except Exception:  # one stale or corrupt record must not hide the rest of the pool
            continue
    return state


def free_by_type(
    pool: Pool,
    allocations: Mapping[str, Mapping[str, Any]],
    *,
    state: PoolState | None = None,
) -> dict[str, dict[str, Any]]:
    """Per GPU type: GPUs, idle GPUs, free GiB (unreserved memory) and price per GPU-hour."""
    st = state if state is not None else stored_state(pool, allocations)
    return {
        name: {
            "gpus": tf.gpus,
            "idle_gpus": tf.idle_gpus,
            "free_gib": round(tf.free_gib, 3),
            "price_usd_per_hour": pool.price_for(name),
        }
        for name, tf in st.free_by_type().items()
    }


def _gpu_cell(
    pool: Pool, g: int, held: Sequence[tuple[str, Mapping[str, Any]]], mig_occ: int
) -> Text:
    mode = int(pool.gpu_mode[g])
    text = Text()
    if mode == MODE_MIG:
        slices = sorted(held, key=lambda h: (h[1].get("option") or {}).get("mig_start") or 0)
        for jid, a in slices:
            o = a.get("option") or {}
            text.append(f"[{o.get('mig_profile')}@{o.get('mig_start')} ", style="cyan")
            text.append(jid)
            text.append("] ", style="cyan")
        free_compute = MIG_COMPUTE_SLICES - bin(mig_occ & 0x7F).count("1")
        free_mem = MIG_MEMORY_SLICES - bin(mig_occ >> MIG_COMPUTE_SLICES).count("1")
        text.append(
            f"free {free_compute}/{MIG_COMPUTE_SLICES} compute, "
            + f"{free_mem}/{MIG_MEMORY_SLICES} memory",
            style="dim",
        )
        return text
    if not held:
        return Text("idle", style="dim")
    for n, (jid, a) in enumerate(held):
        if n:
            text.append(", ")
        text.append(jid)
        if mode == MODE_SHARED:
            text.append(f" ({_mib_gib(int(a.get('reserved_mib', 0)))} GiB)", style="dim")
    if mode == MODE_SHARED:
        cap = int(pool.max_shared[g])
        text.append(f"  [{len(held)}/{cap} shares]", style="dim")
    return text
