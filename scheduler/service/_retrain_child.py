"""The retraining process the leader starts (``python -m scheduler.service._retrain_child
JOB.json``): never in the placement loop's process.

It reads the published rows and the service's whole history list (``SNUGFIT_REDIS_URL``,
from the environment so no password sits in a file), asks grouped CV whether a learned tier
trained with the new history rows is no worse (:mod:`predictor._retrain_cv`: two tests, one of
the new rows against the incumbent's calibration per node, one of the old rows), and only then
writes it to the active artifact path, keeping the one it replaces as
``learned.previous.json``. Either way it writes a result JSON the leader logs as a
``retrain`` event. Simulated rows never train, and OOM rows neither: their peak is only a lower
bound. History rows are grouped by node for grouped CV (:func:`_usable`). The rows before
``trained_offset`` in the list are those the incumbent was trained on; the rest are new.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["retrain"]


def _usable(rows: list[Any], where: str) -> list[Any]:
    """The rows that may train, each grouped under its node for grouped CV.

    A worker names each row's source by job attempt, so every row would be a CV group of its
    own, and the runs of one recurring job would sit on both sides of a fold (inner CV then
    trusts a correction that only memorised them). A node is what a published source is: one
    stack (driver, NVML reading, software) whose rows share its biases.
    """
    from dataclasses import replace

    from predictor.measurements import measurements_from_lines

    out = []
    for m in measurements_from_lines(rows, where, strict=False):
        if m.oom:
            continue
        node = m.hardware.get("node") if isinstance(m.hardware, dict) else None
        out.append(replace(m, source=f"snugfit node {node or 'unknown'} | {m.source}"))
    return out


def _version_of(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _install(model: Any, target: Path) -> None:
    """Write ``model`` at ``target``; the artifact there before stays as learned.previous.json.
    Every step is a rename, so a client never reads half a file or finds none."""
    from predictor.artifact import save_artifact

    target.parent.mkdir(parents=True, exist_ok=True)
    candidate = save_artifact(model, target.with_name("learned.candidate.json"))
    if target.exists():
        tmp = target.with_name("learned.previous.json.tmp")
        shutil.copy2(target, tmp)
        tmp.replace(target.with_name("learned.previous.json"))
    candidate.replace(target)


def retrain(job: dict[str, Any]) -> dict[str, Any]:
    """One retraining (module doc); returns the result the leader logs."""
    from predictor._retrain_cv import compare_retrained, no_worse
    from predictor.artifact import active_artifact_path
    from predictor.learned import LearnedPredictor
    from predictor.measurements import load_measurements
    from predictor.traced import TracedPredictor
    from scheduler.service.store.embedded import connect
    from scheduler.service.store.keys import Keys

    t0 = time.monotonic()
    target = Path(job["artifact"])
    previous = _version_of(active_artifact_path())
    published = load_measurements([Path(p) for p in job.get("data") or []] or None)
    r = connect(os.environ.get("SNUGFIT_REDIS_URL"))
    key = Keys(job["prefix"]).history
    rows = r.lrange(key, 0, -1)
    offset = min(int(job.get("trained_offset", 0)), len(rows))
    seen = {m.id for m in published}
    old = [m for m in _usable(rows[:offset], key) if m.id not in seen]
    seen |= {m.id for m in old}
    new = [m for m in _usable(rows[offset:], key) if m.id not in seen]
    out: dict[str, Any] = {
        "accepted": False,
        "previous_version": previous,
        "version": None,
        "n_rows": len(published) + len(old) + len(new),
        "n_new_rows": len(new),
        "history_offset": len(rows),
        "pid": os.getpid(),
    }
    if not new:
        out["reason"] = "no new usable history rows (simulated, OOM or malformed rows only)"
    else:
        ms = [*published, *old, *new]
        # The base predictions use: traced peaks where the trace cache holds them (nothing is
        # traced here: that takes minutes and belongs to `snugfit trace`), else analytical.
        base = TracedPredictor()
        folds = int(job.get("folds", 5))
        cv = compare_retrained(ms, [False] * (len(ms) - len(new)) + [True] * len(new),
                               base=base, n_splits=folds)  # fmt: skip
        accepted, out["reason"] = no_worse(cv)
        out["cv"] = cv
        if accepted:
            model = LearnedPredictor(base=base, n_splits=folds).fit(ms)
            _install(model, target)
            out["accepted"], out["version"] = True, model.version_
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def main(argv: list[str]) -> int:
    job_path = Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    result = retrain(job)
    res = Path(job["result"])
    tmp = res.with_name(res.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
