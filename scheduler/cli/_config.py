"""``snugfit.toml``: defaults for the CLI's options, from a file.

Where a value comes from, first match wins:

1. the command line (``--pool small``);
2. the option's environment variable, where it has one (``SNUGFIT_REDIS_URL`` for ``--redis``);
3. the config file: ``--config FILE`` / ``$SNUGFIT_CONFIG`` when given (that file alone;
   ``none``: no file), else
   ``./snugfit.toml`` in the working directory, then ``$SNUGFIT_HOME/snugfit.toml`` (default
   ``~/.cache/snugfit``), merged key by key: a project's file overrides the user's;
4. the option's built-in default.

That is Click's own order (command line, environment, ``default_map``, default), so the file
becomes each command's ``default_map``. Keys are the options' long names with ``_`` for ``-``.
Top-level keys apply to every command that has the option; a ``[command]`` table (``[scheduler]``,
``[simulate.workload]``) applies to that command and wins over the top level::

    redis = "redis://127.0.0.1:6379/0"    # --redis / --url
    prefix = "snugfit"                    # --prefix
    pool = "mixed"                        # --pool: a shipped name or a path
    policy = "rightsize"                  # --policy
    datasets = "/opt/snugfit/datasets"    # the shipped data (as $SNUGFIT_DATASETS)

    [scheduler]
    metrics_port = 9400
    [worker]
    time_scale = 0.001

Relative paths in a file are relative to that file's folder. Every value is checked when the
file is read (top-level keys by :class:`ConfigFile`) or when its command runs (a section's keys
against that command's options and types); an error names the file, the key, the value and the
fix.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "CONFIG_NAME",
    "ConfigDefaults",
    "ConfigFile",
    "LoadedConfig",
    "config_files",
    "datasets_from",
    "load",
]

CONFIG_NAME = "snugfit.toml"
ENV_CONFIG = "SNUGFIT_CONFIG"
_URL_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://")


class ConfigFile(BaseModel):
    """The top-level keys of ``snugfit.toml`` (command tables are checked against the
    commands themselves)."""

    model_config = ConfigDict(extra="forbid")

    redis: str | None = Field(default=None, description="Redis URL (--redis / --url).")
    prefix: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="Key prefix (--prefix)."
    )
    pool: str | None = Field(default=None, description="Pool file or shipped name (--pool).")
    policy: str | None = Field(default=None, description="Placement policy (--policy).")
    datasets: str | None = Field(default=None, description="The shipped data folder.")

    @field_validator("redis")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(_URL_SCHEMES):
            raise ValueError(f"must be a Redis URL starting with one of {', '.join(_URL_SCHEMES)}")
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str | None) -> str | None:
        from scheduler.policies.registry import PolicyName

        names = [p.value for p in PolicyName]
        if v is not None and v not in names:
            raise ValueError(f"unknown policy; use one of {', '.join(names)}")
        return v


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    source: Path


@dataclass(slots=True)
class LoadedConfig:
    """The merged files: top-level values and command tables, each value with its file."""

    files: list[Path] = field(default_factory=list)
    top: dict[str, _Value] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)  # nested dicts of _Value

    def section(self, path: tuple[str, ...]) -> dict[str, Any]:
        node: Any = self.sections
        for name in path:
            node = node.get(name, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}


def config_files(explicit: str | Path | None = None) -> list[Path]:
    """The files to read, lowest precedence first."""
    given = explicit or os.environ.get(ENV_CONFIG)
    if given == "none":
        return []  # `SNUGFIT_CONFIG=none`: no file at all (the demo's child processes)
    if given:
        p = Path(given).expanduser()
        if not p.is_file():
            raise click.ClickException(
                f"config file {str(p)!r} (from {'--config' if explicit else '$' + ENV_CONFIG}) "
                "does not exist; fix the path or unset it"
            )
        return [p]
    # $SNUGFIT_HOME as scheduler.service.store.embedded reads it, without importing redis.
    home = Path(os.environ.get("SNUGFIT_HOME") or Path.home() / ".cache" / "snugfit")
    out: list[Path] = []
    for p in (home / CONFIG_NAME, Path.cwd() / CONFIG_NAME):
        if p.is_file() and p.resolve() not in [q.resolve() for q in out]:
            out.append(p)
    return out


def load(files: list[Path], commands: list[str]) -> LoadedConfig:
    """Read and merge ``files`` (lowest precedence first); ``commands`` are the CLI's command
    names, so a misspelt table is caught at once."""
    cfg = LoadedConfig(files=list(files))
    for path in files:
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise click.ClickException(f"{path}: not a readable TOML file: {exc}") from None
        top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in raw.items() if isinstance(v, dict)}
        try:
            ConfigFile.model_validate(top)
        except ValidationError as exc:
            raise click.ClickException(_pydantic_message(path, exc, top)) from None
        for k, v in top.items():
            cfg.top[k] = _Value(v, path)
        for name, table in tables.items():
            if name not in commands:
                raise click.ClickException(
                    f"{path}: table [{name}] is not a snugfit command; use one of "
                    f"{', '.join(sorted(commands))} (or a top-level key: "
                    f"{', '.join(ConfigFile.model_fields)})"
                )
            _merge(cfg.sections.setdefault(name, {}), table, path)
    return cfg


def _merge(into: dict[str, Any], table: Mapping[str, Any], path: Path) -> None:
    for k, v in table.items():
        if isinstance(v, dict):
            sub = into.get(k)
            if not isinstance(sub, dict):
                sub = into[k] = {}
            _merge(sub, v, path)
        else:
            into[k] = _Value(v, path)


def _pydantic_message(path: Path, exc: ValidationError, data: Mapping[str, Any]) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err.get("loc", ())) or "?"
        got = data.get(key, "(missing)")
        if err.get("type") == "extra_forbidden":
            known = ", ".join(ConfigFile.model_fields)
            parts.append(
                f"{path}: unknown top-level key `{key}` (got {got!r}); top-level keys are "
                f"{known}; other options go in a [command] table, e.g. [scheduler]"
            )
        else:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{path}: key `{key}` = {got!r}: {msg}")
    return "\n".join(parts)


def datasets_from(cfg: LoadedConfig) -> Path | None:
    """The ``datasets`` key as an absolute folder (relative to its file), checked to exist."""
    v = cfg.top.get("datasets")
    if v is None:
        return None
    p = Path(str(v.value)).expanduser()
    if not p.is_absolute():
        p = v.source.parent / p
    if not (p / "pools").is_dir():
        raise click.ClickException(
            f"{v.source}: key `datasets` = {v.value!r}: {p} is not a snugfit datasets folder "
            "(it has no pools/); point it at the folder holding pools/, models/, artifacts/"
        )
    return p.resolve()


# ---------------------------------------------------------------------------------------------
# from the file to each command's default_map


def _keys(param: click.Parameter) -> set[str]:
    out = {param.name or ""}
    for opt in getattr(param, "opts", ()):
        if opt.startswith("--"):
            out.add(opt[2:].replace("-", "_"))
    return out


def command_defaults(
    cfg: LoadedConfig, cmd: click.Command, path: tuple[str, ...], ctx: click.Context
) -> dict[str, Any]:
    """``cmd``'s ``default_map`` from the config (nested for groups such as ``simulate``)."""
    out: dict[str, Any] = {}
    table = cfg.section(path)
    label = " ".join(path)
    if isinstance(cmd, click.Group):
        for name, v in table.items():
            if not isinstance(v, dict):
                raise click.ClickException(
                    f"{v.source}: key `{name}` in [{'.'.join(path)}]: `snugfit {label}` takes "
                    f"no options of its own; put it under [{'.'.join(path)}.<subcommand>]"
                )
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                out[name] = command_defaults(cfg, sub, (*path, name), ctx)
        return out
    options = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
    used: set[str] = set()
    for p in options:
        keys = _keys(p)
        val = next((table[k] for k in keys if k in table and not isinstance(table[k], dict)), None)
        used |= keys & set(table)
        if val is None and not p.multiple:
            # The top level names one value (one pool, one policy): a repeatable option such
            # as `simulate workload --policy` keeps its own default unless its table sets it.
            val = next((cfg.top[k] for k in keys if k in cfg.top), None)
        if val is not None:
            out[p.name or ""] = _convert(p, val, f"[{'.'.join(path)}]" if table else "", ctx)
    unknown = sorted(set(table) - used)
    if unknown:
        first = table[unknown[0]]
        where = getattr(first, "source", cfg.files[-1] if cfg.files else CONFIG_NAME)
        names = sorted(
            o[2:].replace("-", "_") for p in options for o in p.opts if o.startswith("--")
        )
        raise click.ClickException(
            f"{where}: [{'.'.join(path)}] key `{unknown[0]}` is not an option of `snugfit "
            f"{label}`; its options are: {', '.join(names)}"
        )
    return out


def _convert(param: click.Option, v: _Value, where: str, ctx: click.Context) -> Any:
    value = v.value
    if param.multiple and not isinstance(value, list):
        value = [value]
    if isinstance(param.type, click.Path | click.File) or param.type.name in ("file", "pool"):
        value = _relative_to(value, v.source.parent)
    try:
        if param.multiple:
            return [param.type.convert(x, param, ctx) for x in value]
        return param.type.convert(value, param, ctx)
    except click.BadParameter as exc:
        key = (param.opts[-1] if param.opts else param.name or "?").lstrip("-").replace("-", "_")
        raise click.ClickException(
            f"{v.source}: key `{key}`{' in ' + where if where else ''} = {v.value!r}: {exc.message}"
        ) from None


def _relative_to(value: Any, folder: Path) -> Any:
    if isinstance(value, list):
        return [_relative_to(x, folder) for x in value]
    if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
        candidate = folder / value
        if candidate.exists():
            return str(candidate)
    return value


class ConfigDefaults(dict[str, Any]):
    """The root context's ``default_map``: a command's defaults are built when Click asks for
    them (``parent.default_map.get(name)``), so only the command that runs is imported."""

    def __init__(self, cfg: LoadedConfig, group: click.Group, ctx: click.Context) -> None:
        super().__init__()
        self._cfg, self._group, self._ctx = cfg, group, ctx

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self:
            cmd = self._group.get_command(self._ctx, key)
            if cmd is None:
                return default
            self[key] = command_defaults(self._cfg, cmd, (key,), self._ctx)
        return super().get(key, default)
