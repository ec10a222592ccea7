"""``snugfit pool``'s CPU and host-memory view: per node, cores and RAM taken against what the
node has (each job holds its own figures or its node's share, :mod:`scheduler.core.host`), and
the node's labels (what a job's node selector matches, :mod:`scheduler.core.selector`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from scheduler.core.decision import Option
from scheduler.core.host import fmt_cpus
from scheduler.core.pool import MIB_PER_GIB, MILLI_PER_CPU, Pool
from scheduler.core.state import PoolState

__all__ = ["host_by_node", "host_line", "host_rows", "host_table"]


def host_rows(pool: Pool, state: PoolState) -> list[dict[str, Any]]:
    """One dict per node: CPUs and host memory (GiB) of the node, taken and free; its labels."""
    out: list[dict[str, Any]] = []
    jobs: dict[int, int] = {}
    for option in state.allocations().values():
        # A multi-node gang counts on each of its nodes.
        for k in {int(pool.gpu_node[g]) for g in option.gpu_indices}:
            jobs[k] = jobs.get(k, 0) + 1
    for k, node in enumerate(pool.nodes):
        cpu_cap = int(pool.node_cpu_milli[k])
        cpu_used = int(state.node_cpu_milli[k])
        host_cap = int(pool.node_host_mib[k])
        host_used = int(state.node_host_mib[k])
        out.append(
            {
                "node": node.name,
                "gpu_type": node.gpu_type,
                "gpus": node.count,
                "jobs": jobs.get(k, 0),
                "cpus": cpu_cap / MILLI_PER_CPU,
                "cpus_used": cpu_used / MILLI_PER_CPU,
                "cpus_free": (cpu_cap - cpu_used) / MILLI_PER_CPU,
                "host_memory_gib": round(host_cap / MIB_PER_GIB, 3),
                "host_used_gib": round(host_used / MIB_PER_GIB, 3),
                "host_free_gib": round((host_cap - host_used) / MIB_PER_GIB, 3),
                "labels": dict(node.labels),
            }
        )
    return out


def host_by_node(pool: Pool, allocations: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`host_rows` of the state that stored allocations describe."""
    from scheduler.cli._render_pool import stored_state  # it imports host_table from here

    return host_rows(pool, stored_state(pool, allocations))


def _num(x: float) -> str:
    return f"{x:,.1f}".removesuffix(".0")


def host_table(pool: Pool, state: PoolState) -> Table:
    """The "CPU and host memory by node" table of ``snugfit pool``."""
    table = Table(title="CPU and host memory by node", title_justify="left")
    # The labels column only where some node has labels (most pools have none).
    labelled = any(n.labels for n in pool.nodes)
    cols = ("node", "GPUs", "jobs", "CPUs used/cap", "host GiB used/cap")
    for col in (*cols, "labels") if labelled else cols:
        table.add_column(col, justify="left" if col in ("node", "labels") else "right")
    for r in host_rows(pool, state):
        cells = [
            r["node"],
            str(r["gpus"]),
            str(r["jobs"]),
            f"{_num(r['cpus_used'])}/{_num(r['cpus'])}",
            f"{_num(r['host_used_gib'])}/{_num(r['host_memory_gib'])}",
        ]
        if labelled:
            cells.append(",".join(f"{k}={v}" for k, v in r["labels"].items()))
        table.add_row(*cells)
    return table


def host_line(option: Option | None) -> Text | None:
    """``snugfit explain``'s line for what a placed job holds of its node's cores and RAM."""
    if option is None or option.cpus is None or option.host_memory_gib is None:
        return None
    cpus = fmt_cpus(round(option.cpus * MILLI_PER_CPU))
    where = option.node if option.n_nodes == 1 else f"each of {option.n_nodes} nodes"
    return Text(f"host: {cpus} CPUs and {option.host_memory_gib:,.1f} GiB host memory on {where}")
