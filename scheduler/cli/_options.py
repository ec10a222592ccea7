"""Click options and parameter types that several commands share, declared once.

Paths to shipped data never depend on the working directory: a path that does not exist where
the user stands is looked up in the shipped ``datasets`` folder
(:func:`predictor._paths.datasets_dir`), so ``--pool mixed``, ``--pool mixed.toml`` and
``--pool datasets/pools/mixed.toml`` work from any folder, checkout or installed package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

__all__ = [
    "NODE_HEARTBEAT_S",
    "NODE_STALE_S",
    "PoolFile",
    "ShippedFile",
    "client_for",
    "home_file_option",
    "host_option",
    "jobs_file_option",
    "measurement_files",
    "node_heartbeat_option",
    "node_stale_option",
    "pool_option",
    "port_option",
    "redis_option",
    "shipped_pools",
    "store_options",
    "time_scale_option",
]


def shipped_pools() -> dict[str, Path]:
    """Pool name -> file, for the pools in ``datasets/pools``."""
    from predictor._paths import datasets_dir

    folder = datasets_dir() / "pools"
    return {p.stem: p for p in sorted(folder.glob("*.toml"))} if folder.is_dir() else {}


class ShippedFile(click.ParamType):
    """An existing file: as given (relative to the working directory), else, for a relative
    path starting with ``datasets/``, the same file in the shipped datasets folder."""

    name = "file"

    def resolve(self, value: str) -> Path | None:
        from predictor._paths import datasets_dir

        p = Path(value).expanduser()
        if p.is_file():
            return p
        if not p.is_absolute() and p.parts[:1] == ("datasets",):
            shipped = datasets_dir().joinpath(*p.parts[1:])
            if shipped.is_file():
                return shipped
        return None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path) and value.is_file():
            return value
        got = self.resolve(str(value))
        if got is None:
            self.fail(self.missing(str(value)), param, ctx)
        return got

    def missing(self, value: str) -> str:
        from predictor._paths import datasets_dir

        return (
            f"no file {value!r} in the working directory ({Path.cwd()}) nor in the shipped "
            f"datasets folder ({datasets_dir()}); give an existing path"
        )


class PoolFile(ShippedFile):
    """A pool TOML: a path (as :class:`ShippedFile`) or the name of a shipped pool (``mixed``,
    ``mixed.toml``). Completes shipped pool names in the shell."""

    name = "pool"

    def resolve(self, value: str) -> Path | None:
        got = super().resolve(value)
        if got is not None:
            return got
        pools = shipped_pools()
        return pools.get(value.removesuffix(".toml")) if "/" not in value else None

    def missing(self, value: str) -> str:
        names = ", ".join(shipped_pools()) or "none found"
        return (
            f"no pool file {value!r} in the working directory ({Path.cwd()}) and no shipped "
            f"pool of that name (shipped: {names}); give a path to a pool TOML or a shipped name"
        )

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        from click.shell_completion import CompletionItem

        names = [CompletionItem(n) for n in shipped_pools() if n.startswith(incomplete)]
        return [*names, CompletionItem(incomplete, type="file")]


def pool_option(*, default: str | None = "mixed", help: str = "", dest: str = "pool_file") -> Any:
    """``--pool``: a pool TOML path or a shipped pool name (``snugfit.toml`` key ``pool``)."""
    text = help or "Pool: a TOML file, or a shipped pool name (mixed, small)."
    return click.option(
        "--pool",
        dest,
        type=PoolFile(),
        default=default,
        show_default=default is not None,
        help=text,
    )


#: ``--data``: the measured rows a predictor command reads (``datasets/measured`` by default).
measurement_files = click.option(
    "--data",
    "paths",
    multiple=True,
    type=ShippedFile(),
    help="Measurement JSONL file(s); default: datasets/measured/*.jsonl.",
)


#: ``--redis``: the service's Redis, passed to the client as ``redis_url`` (``connect`` falls
#: back to the embedded server when neither the option nor the variable is set).
redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="SNUGFIT_REDIS_URL",
    default=None,
    help="Redis URL (default: $SNUGFIT_REDIS_URL, else embedded).",
)


def client_for(redis_url: str | None, trace_budget_s: float | None = None) -> Any:
    """The :class:`~scheduler.service.client.Client` for a command's ``--redis`` value
    (imported here, so ``--help`` and completion never load the service); ``trace_budget_s``
    None keeps the client's default wait for traces at submit."""
    from scheduler.service.client import Client

    if trace_budget_s is None:
        return Client(redis_url)
    return Client(redis_url, trace_budget_s=trace_budget_s)


_url_option = click.option(
    "--redis",
    "--url",
    "url",
    envvar="SNUGFIT_REDIS_URL",
    default=None,
    help="Redis URL (default: $SNUGFIT_REDIS_URL, else the embedded server).",
)
_prefix_option = click.option(
    "--prefix", default="snugfit", show_default=True, help="Key prefix of the cluster."
)


def store_options(f: Any) -> Any:
    """``--redis``/``--url`` (as ``url``) and ``--prefix``: the commands that open the store
    directly (``open_store(url, prefix)``) rather than through the client."""
    return _url_option(_prefix_option(f))


def jobs_file_option(help: str = "Jobs as JSONL, JSON or YAML.") -> Any:
    """``--input`` (as ``input_path``): the job file a command reads (``load_specs``)."""
    return click.option(
        "--input", "input_path", required=True, type=click.Path(path_type=Path), help=help
    )


def host_option(flag: str, *, help: str) -> Any:
    """An address to bind, loopback by default (``help`` says what another address exposes)."""
    return click.option(flag, default="127.0.0.1", show_default=True, help=help)


def port_option(flag: str, *, default: int | None, help: str) -> Any:
    """A TCP port to serve on (0: a free one, which the command prints)."""
    return click.option(
        flag,
        type=click.IntRange(0, 65535),
        default=default,
        show_default=default is not None,
        help=help,
    )


#: Node liveness: a worker beats every ``NODE_HEARTBEAT_S``; a node whose last beat is older
#: than ``NODE_STALE_S`` counts as down, with one default for the scheduler (which stops placing
#: on it) and the dashboard (which shows it down). The stale age must exceed the beat.
NODE_HEARTBEAT_S = 5.0
NODE_STALE_S = 15.0


def node_stale_option(*, help: str) -> Any:
    """``--node-stale``: seconds without a worker heartbeat before a node counts as down."""
    return click.option(
        "--node-stale",
        type=click.FloatRange(min=0.1),
        default=NODE_STALE_S,
        show_default=True,
        help=help,
    )


def node_heartbeat_option(f: Any) -> Any:
    """``--node-heartbeat``: seconds between a worker's node liveness beats."""
    return click.option(
        "--node-heartbeat",
        type=click.FloatRange(min=0.01),
        default=NODE_HEARTBEAT_S,
        show_default=True,
        help="Seconds between node liveness beats (the scheduler's --node-stale must exceed it).",
    )(f)


def time_scale_option(*, default: float | None, help: str) -> Any:
    """``--time-scale``: real seconds per workload second of a time-scaled (simulated) run."""
    return click.option(
        "--time-scale",
        type=click.FloatRange(min=0.0, min_open=True),
        default=default,
        show_default=default is not None,
        help=help,
    )


def home_file_option(flag: str, *, what: str, name: str) -> Any:
    """A file option that defaults to ``$SNUGFIT_HOME/<name>``: None here, the command resolves
    it with :func:`~scheduler.service.store.embedded.snugfit_home` when it runs."""
    return click.option(
        flag,
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=f"{what} (default: $SNUGFIT_HOME/{name}).",
    )
