"""``snugfit node cordon|drain|uncordon NAME``: take a node out of service and back.

``cordon``: no new placements. ``drain``: no new placements, and jobs placed there that have
not started move to other nodes (running jobs finish). ``uncordon``: back in service.
The state is shown by ``snugfit pool`` (see :mod:`scheduler.service.nodes`).
"""

from __future__ import annotations

import click

from scheduler.cli._options import store_options
from scheduler.cli.output import Output, output_options

__all__ = ["node_command"]

_ACTIONS = {"cordon": "cordoned", "drain": "draining", "uncordon": None}


@click.command("node")
@click.argument("action", type=click.Choice(sorted(_ACTIONS)))
@click.argument("name")
@store_options
@output_options(table=False, json_help="Print {node, action, admin_state} as JSON.")
def node_command(action: str, name: str, url: str | None, prefix: str, out: Output) -> None:
    """Cordon, drain or uncordon the node NAME (as in the pool file)."""
    from scheduler.cli.ops import connect_store, published_pool

    store = connect_store(url, prefix)
    try:
        config = published_pool(store, prefix)
        names = [str(n.get("name")) for n in config.get("nodes", [])]
        if name not in names:
            raise click.ClickException(
                f"node {name!r} is not in pool {config.get('name')!r}; its nodes are: "
                f"{', '.join(names)}"
            )
        state = _ACTIONS[action]
        store.set_node_admin(name, state)
        store.wake()
    finally:
        store.close()
    if out.json:
        from scheduler.cli._views import NodeView

        out.emit_json(NodeView(node=name, action=action, admin_state=state))
        return
    if state is None:
        click.echo(f"node {name}: back in service")
    elif state == "cordoned":
        click.echo(f"node {name}: cordoned (no new placements; its jobs stay)")
    else:
        click.echo(
            f"node {name}: draining (no new placements; unstarted jobs move elsewhere, running "
            "jobs finish; `snugfit pool` shows it drained when empty)"
        )
