"""Convert the published validation tables into measurement rows.

``../shared/validation/vram_measured.jsonl`` and ``runtime_measured.jsonl`` were collected by
hand from papers, READMEs and benchmark tables, each in its source's own vocabulary ("FSDP full
shard", "LoRA r=8 alpha=16 on query,value", "tokens/s/GPU"). This module maps each row onto a
JobSpec plus measured values in the shared schema of :mod:`predictor.measurements`, and returns
every row it cannot express with a one-line reason, so nothing is dropped silently.

``python -m predictor._published`` regenerates ``datasets/measured/published.jsonl``. The rules
are documented in ``datasets/measured/README.md``; keep the two in step.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._checks import CheckFailure, check_rows, tag_failures
from ._paths import datasets_dir, shared_dir
from ._published_fields import _Skip
from ._published_runtime import convert_runtime_row
from ._published_runtime import metric_is as metric_is  # re-exported
from ._published_runtime import other_get as other_get  # re-exported
from ._published_vram import convert_vram_row
from .exceptions import DataError, SpecError

__all__ = [
    "Conversion",
    "SkippedRow",
    "convert_published",
    "convert_runtime_row",
    "convert_vram_row",
    "write_published",
]


@dataclass(frozen=True, slots=True)
class SkippedRow:
    id: str
    file: str
    reason: str


@dataclass(frozen=True, slots=True)
class Conversion:
    rows: list[dict[str, Any]]
    skipped: list[SkippedRow]
    #: Rows kept but flagged non-calibratable by a data check (``predictor._checks``).
    failures: list[CheckFailure] = field(default_factory=list)


# ------------------------------------------------------------------------------ driver
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise DataError(f"validation file {str(path)!r} not found; set SNUGFIT_SHARED")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def convert_published(validation_dir: str | Path | None = None) -> Conversion:
    """Convert every row of the two validation files (order follows the files), then run the
    data checks of :mod:`predictor._checks` and tag the rows that fail them."""
    base = Path(validation_dir) if validation_dir else shared_dir() / "validation"
    rows: list[dict[str, Any]] = []
    skipped: list[SkippedRow] = []
    for fname, conv in (
        ("vram_measured.jsonl", convert_vram_row),
        ("runtime_measured.jsonl", convert_runtime_row),
    ):
        for r in _read_jsonl(base / fname):
            try:
                rows.append(conv(r))
            except _Skip as exc:
                skipped.append(SkippedRow(str(r.get("id")), fname, str(exc)))
            except (SpecError, DataError) as exc:
                skipped.append(SkippedRow(str(r.get("id")), fname, f"invalid spec: {exc}"))
    # Rows that contradict physics or their own table are kept, tagged non-calibratable.
    failures = check_rows(rows)
    tag_failures(rows, failures)
    return Conversion(rows, skipped, failures)


def write_published(
    output: str | Path | None = None, validation_dir: str | Path | None = None
) -> Conversion:
    """Regenerate ``datasets/measured/published.jsonl`` (and its ``skipped`` sidecar)."""
    conv = convert_published(validation_dir)
    out = Path(output) if output else datasets_dir() / "measured" / "published.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for row in conv.rows:
            fh.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
    skipped_path = out.with_name(out.stem + ".skipped.tsv")
    with skipped_path.open("w", encoding="utf-8") as fh:
        fh.write("id\tfile\treason\n")
        for s in conv.skipped:
            fh.write(f"{s.id}\t{s.file}\t{s.reason}\n")
    checks_path = out.with_name(out.stem + ".checks.tsv")
    with checks_path.open("w", encoding="utf-8") as fh:
        fh.write("id\tcheck\treason\n")
        for f in conv.failures:
            fh.write(f"{f.id}\t{f.check}\t{f.reason}\n")
    return conv


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    conv = write_published(args[0] if args else None)
    print(f"wrote {len(conv.rows)} rows; skipped {len(conv.skipped)}")
    print(f"{len({f.id for f in conv.failures})} rows fail a data check (non-calibratable):")
    for f in conv.failures:
        print(f"  {f.id}\t{f.check}\t{f.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
