"""How every ``snugfit`` command writes what it prints: a table, tab-separated text or JSON.

One rule for all commands, so a new command inherits it by taking :func:`output_options`:

- ``--format table`` (the default on a terminal): rich tables at the terminal's width. When
  stdout is not a terminal (``--format table`` into a file or a pager) the tables are laid out at
  their *natural* width, so no column is cut or wrapped: the width a terminal would impose is
  exactly what truncated ``explain``'s "status / why it lost" and ``pool``'s costs before.
- ``--format tsv`` (the default when stdout is not a terminal): one tab-separated line per row
  under one header line per table; a table's title and any free text become ``# `` comment
  lines and a blank line separates tables, so ``grep -v '^#'``, ``cut -f`` and ``sort -t$'\\t'``
  work. Cells are the table's own text, complete (tabs and newlines inside become spaces).
- ``--format json`` or ``--json``: typed JSON (:func:`dumps_json`), one document per command
  (or one per line where the command streams).

The renderables themselves come from :mod:`scheduler.cli.render` (pure); only this module
decides how they reach stdout.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import click

__all__ = [
    "FORMATS",
    "Format",
    "Output",
    "dumps_json",
    "jsonable",
    "output_options",
    "resolve_format",
    "to_tsv",
]

Format = Literal["table", "tsv", "json"]
FORMATS: tuple[str, ...] = ("table", "tsv", "json")
F = TypeVar("F", bound=Callable[..., Any])


def resolve_format(fmt: str | None, as_json: bool = False, *, tty: bool | None = None) -> Format:
    """``--json`` wins, then ``--format``; unset means table on a terminal, tsv in a pipe."""
    if as_json or fmt == "json":
        return "json"
    if fmt in ("table", "tsv"):
        return cast(Format, fmt)
    if tty is None:
        tty = _stdout_is_tty()
    return "table" if tty else "tsv"


def _stdout_is_tty() -> bool:
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# typed JSON


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values: pydantic models and dataclasses as their fields, enums as
    values, paths as strings, numpy scalars and arrays as numbers and lists, and every
    non-finite float as ``null`` (JSON has no NaN: ``json.dumps`` would write an invalid
    ``NaN`` token)."""
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, enum.Enum):
        return jsonable(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic v2
        return jsonable(dump(mode="python"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    item = getattr(obj, "item", None)
    if callable(item):  # numpy scalar
        return jsonable(item())
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):  # numpy array
        return jsonable(tolist())
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON: {obj!r:.80}")


def dumps_json(obj: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of :func:`jsonable` (never ``NaN``, never ``"None"``)."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# tab-separated text


def _plain(cell: Any, markup: bool = True) -> str:
    from rich.text import Text

    if cell is None:
        return ""
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        text = Text.from_markup(cell).plain if markup else cell
    else:
        text = str(cell)
    return " ".join(text.replace("\t", " ").splitlines()).strip()


def to_tsv(renderable: Any) -> str:
    """A rich renderable (Table, Text, Group, str, or a list of them) as tab-separated text."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    blocks: list[list[str]] = []

    def walk(r: Any) -> None:
        if isinstance(r, Group):
            for part in r.renderables:
                walk(part)
        elif isinstance(r, list | tuple):
            for part in r:
                walk(part)
        elif isinstance(r, Table):
            lines = []
            if r.title:
                lines.append("# " + _plain(r.title))
            lines.append("\t".join(_plain(c.header) for c in r.columns))
            cells = [list(c.cells) for c in r.columns]
            for i in range(r.row_count):
                lines.append("\t".join(_plain(col[i]) if i < len(col) else "" for col in cells))
            blocks.append(lines)
        elif isinstance(r, Text | str):
            text = r.plain if isinstance(r, Text) else r
            notes = ["# " + ln if ln else "#" for ln in text.splitlines()]
            if blocks and blocks[-1] and blocks[-1][0].startswith("#") and _is_notes(blocks[-1]):
                blocks[-1].extend(notes)
            else:
                blocks.append(notes)
        else:
            blocks.append(["# " + _plain(str(r), markup=False)])

    walk(renderable)
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"


def _is_notes(block: list[str]) -> bool:
    return all(ln.startswith("#") for ln in block)


# ---------------------------------------------------------------------------------------------
# the Output object commands write through


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """Where a command's data goes, in the format the user (or the pipe) chose."""

    format: Format
    width: int | None = None

    @property
    def json(self) -> bool:
        return self.format == "json"

    def emit_json(self, obj: Any, *, indent: int | None = None) -> None:
        click.echo(dumps_json(obj, indent=indent))

    def print(self, renderable: Any) -> None:
        """A table, text or group of them, as ``table`` or ``tsv``; JSON needs :meth:`emit_json`
        (what the data is, not how a table shows it)."""
        if self.format == "tsv":
            click.echo(to_tsv(renderable), nl=False)
            return
        if self.format == "json":
            raise TypeError("Output.print() renders tables; write JSON with emit_json()")
        console = self.console(renderable)
        parts = renderable if isinstance(renderable, list | tuple) else [renderable]
        for part in parts:
            if isinstance(part, str):
                console.print(part, markup=False, highlight=False)
            else:
                console.print(part)

    def console(self, renderable: Any = None) -> Any:
        """A rich Console for this output: the terminal's width on a terminal, else the
        natural width of ``renderable`` (nothing cut), or ``--width`` when given."""
        from rich.console import Console

        width = self.width
        if width is None and not _stdout_is_tty():
            width = natural_width(renderable) if renderable is not None else 10_000
        return Console(file=sys.stdout, width=width, soft_wrap=False, highlight=False)


def natural_width(renderable: Any) -> int:
    """The widest line ``renderable`` needs when nothing is wrapped or cut."""
    from rich.console import Console
    from rich.measure import Measurement

    probe = Console(width=100_000, file=io.StringIO(), soft_wrap=False)
    parts = renderable if isinstance(renderable, list | tuple) else [renderable]
    widest = 1
    for part in parts:
        if isinstance(part, str):
            widest = max(widest, *(len(ln) for ln in part.splitlines() or [""]))
            continue
        m = Measurement.get(probe, probe.options, part)
        widest = max(widest, m.maximum)
    return widest


def output_options(
    func: F | None = None, *, table: bool = True, width: bool = True, json_help: str = ""
) -> Any:
    """``--format table|tsv|json``, ``--json`` and ``--width N`` on a click command, replaced by
    one ``out: Output`` keyword argument. ``table=False`` for commands that print only data
    (``--json`` alone, no ``--format``)."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def inner(*args: Any, **kwargs: Any) -> Any:
            fmt = kwargs.pop("output_format", None)
            as_json = kwargs.pop("output_json", False)
            w = kwargs.pop("output_width", None)
            kwargs["out"] = Output(resolve_format(fmt, as_json), w)
            return f(*args, **kwargs)

        decorated: Any = inner
        if width and table:
            decorated = click.option(
                "--width",
                "output_width",
                type=click.IntRange(min=20),
                default=None,
                help="Table width in columns (default: the terminal's; in a pipe, as wide as "
                "the table needs).",
            )(decorated)
        decorated = click.option(
            "--json",
            "output_json",
            is_flag=True,
            help=json_help or "Typed JSON (the same as --format json).",
        )(decorated)
        if table:
            decorated = click.option(
                "--format",
                "output_format",
                type=click.Choice(FORMATS),
                default=None,
                help="table (default on a terminal), tsv (default in a pipe: tab-separated, "
                "nothing truncated) or json.",
            )(decorated)
        return cast(F, decorated)

    return wrap(func) if func is not None else wrap
