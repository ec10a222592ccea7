"""What the benchmark scripts share: where their results go and how they are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "write_result"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``benchmarks/results/NAME`` (indented JSON, one trailing newline) and
    print it, so a run's figures are on screen and in the file the README cites."""
    out = RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    out.write_text(text + "\n")
    print(text)
    return out
