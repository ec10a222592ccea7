"""File loading for job specs: JSON, JSONL and YAML, with size, nesting and alias caps.

A job file is refused unread past :data:`~predictor.limits.MAX_JOB_FILE_BYTES`, and a YAML
document is sized with its aliases expanded before anything is built, so a hostile file fails
fast instead of exhausting memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .exceptions import SpecError
from .limits import MAX_JOB_FILE_BYTES, MAX_NESTING, MAX_YAML_NODES

__all__ = ["iter_spec_dicts"]


def iter_spec_dicts(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, object)`` for each job in a .json/.jsonl/.yaml file.

    ``where`` is "file:line" for JSONL and "file[#i]" otherwise, so errors point at the job.
    """
    p = Path(path)
    if not p.exists():
        raise SpecError(f"job file {str(p)!r} does not exist")
    text = _read_capped(p, MAX_JOB_FILE_BYTES, "job file")
    suffix = p.suffix.lower()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    is_jsonl = suffix == ".jsonl" or (
        suffix not in (".json", ".yaml", ".yml")
        and lines
        and all(ln.lstrip().startswith(("{", "#")) for ln in lines)
    )
    if is_jsonl:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            yield f"{p.name}:{i}", _loads(line, f"{p.name}:{i}", position=False)
        return
    docs: list[Any]
    if suffix == ".json":
        loaded = _loads(text, p.name, position=True)
        docs = loaded if isinstance(loaded, list) else [loaded]
    else:
        import yaml

        try:
            raw_docs = [d for d in _safe_yaml_docs(text, p.name) if d is not None]
        except yaml.YAMLError as exc:
            raise SpecError(f"{p.name}: not valid YAML ({exc})") from None
        except RecursionError:
            raise SpecError(f"{p.name}: nested too deeply to be a job spec") from None
        docs = []
        for d in raw_docs:
            docs.extend(d if isinstance(d, list) else [d])
    for i, d in enumerate(docs):
        yield f"{p.name}[#{i}]", d


def _loads(text: str, where: str, *, position: bool) -> Any:
    """``text`` as JSON, or a SpecError naming ``where`` (and with ``position`` the line and
    column in it: a JSONL line is one line, so it says only what is wrong)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not valid JSON ({exc if position else exc.msg})") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply to be a job spec") from None


def _read_capped(p: Path, cap: int, what: str) -> str:
    """A text file, refused unread when it is larger than ``cap`` bytes."""
    try:
        with p.open("rb") as f:
            data = f.read(cap + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {what} {str(p)!r}: {exc.strerror or exc}") from None
    if len(data) > cap:
        raise SpecError(f"{what} {str(p)!r} is larger than {cap >> 20} MiB; refused unread")
    return data.decode("utf-8", "replace")


def _safe_yaml_docs(text: str, name: str) -> list[Any]:
    """``yaml.safe_load_all`` with aliases capped: the composed graph is sized with each alias
    counted as its full expansion before anything is built, so a 1 KB alias bomb fails fast."""
    import yaml

    loader = yaml.SafeLoader(text)
    docs = []
    try:
        while loader.check_node():
            node = loader.get_node()
            _expanded_size(node, name)
            docs.append(loader.construct_document(node))
    finally:
        loader.dispose()
    return docs


def _expanded_size(root: Any, name: str) -> int:
    """Nodes of ``root`` with every alias expanded (memoised, no recursion); SpecError past
    :data:`MAX_YAML_NODES` or :data:`MAX_NESTING`."""
    import yaml

    size: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_NESTING:
            raise SpecError(f"{name}: nested more than {MAX_NESTING} levels deep; refused")
        if id(node) in size and not done:
            continue
        if isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            kids = [x for kv in node.value for x in kv]
        else:
            size[id(node)] = 1
            continue
        if not done:
            stack.append((node, depth, True))
            stack.extend((k, depth + 1, False) for k in kids if id(k) not in size)
            continue
        total = 1 + sum(size.get(id(k), 1) for k in kids)
        if total > MAX_YAML_NODES:
            raise SpecError(
                f"{name}: expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases "
                "included); refused (a YAML alias bomb?)"
            )
        size[id(node)] = total
    return size[id(root)]
