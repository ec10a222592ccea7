"""Periodic retraining of the learned tier, started by the leader, run in another process.

Every ``every_rows`` new real history rows (workers' measurements; simulated rows never train)
or every ``every_hours`` with at least one new row, whichever comes first, the leader starts
``python -m scheduler.service._retrain_child`` and goes on placing: the step only checks
whether the process has ended (``Popen.poll``). That process trains on the published rows
plus the history, and replaces the active artifact (``$SNUGFIT_HOME/artifacts/learned.json``)
only if grouped cross-validation says the result is no worse (:mod:`predictor._retrain_cv`:
each node's new rows consistent with the incumbent's calibrated residuals, and the candidate
not significantly worse on the rows the incumbent had); the artifact it replaces is kept as
``learned.previous.json``. Clients and the leader follow the active artifact
(:meth:`predictor.tiered.TieredPredictor.refresh`), so the next prediction's ``method`` names
the new version (``learned:<version>``). A ``retrain`` event goes to the
placement log when it starts and when it ends, the second with the CV figures.

The trigger's state sits next to the artifact (``retrain.json``: the real rows counted at the
last retrain, when, and the history-list offset the active artifact was trained up to), so a
restarted leader neither retrains at once nor forgets rows. One retraining runs at a time.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.service.events import event
from scheduler.service.store.keys import DEFAULT_PREFIX

__all__ = ["DEFAULT_RETRAIN_HOURS", "DEFAULT_RETRAIN_ROWS", "RetrainPolicy", "Retrainer"]

log = logging.getLogger("snugfit.scheduler")

#: New real history rows that trigger a retrain: against the 444 published runs (64 with a
#: peak) the learned tier starts from, a batch this size can move a correction, while a retrain
#: (a few nested grouped-CV fits) stays rare next to the placements.
DEFAULT_RETRAIN_ROWS = 200
#: Hours after which any new row triggers a retrain (a quiet cluster still gets its rows in).
DEFAULT_RETRAIN_HOURS = 24.0


@dataclass(frozen=True)
class RetrainPolicy:
    """When and on what to retrain. ``redis_url`` reaches the child through its environment."""

    redis_url: str
    prefix: str = DEFAULT_PREFIX
    every_rows: int = DEFAULT_RETRAIN_ROWS
    every_hours: float = DEFAULT_RETRAIN_HOURS
    data: tuple[str, ...] = ()  # published measurement files (default datasets/measured)
    folds: int = 5
    artifact: Path | None = None  # default: predictor.artifact.home_artifact_path()
    check_s: float = 1.0  # how often the leader looks (a dict read and a subtraction)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the child

    def __post_init__(self) -> None:
        if self.every_rows < 1:
            raise ValueError(f"`every_rows` must be >= 1; got {self.every_rows}")
        if not self.every_hours > 0:
            raise ValueError(f"`every_hours` must be > 0; got {self.every_hours}")


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    started_at: float
    real_rows: int
    job_path: Path
    result_path: Path
    log_path: Path


class Retrainer:
    """The leader's side of retraining: the trigger, the process, the events."""

    def __init__(self, policy: RetrainPolicy) -> None:
        from predictor.artifact import home_artifact_path

        self.policy = policy
        self.artifact = policy.artifact or home_artifact_path()
        self.dir = self.artifact.parent
        self.state_path = self.dir / "retrain.json"
        self.running: _Running | None = None
        self._checked_at = -1e18
        self.state = self._load_state()

    def _load_state(self) -> dict[str, Any]:
        try:
            got = json.loads(self.state_path.read_text(encoding="utf-8"))
            if isinstance(got, dict):
                return got
        except (OSError, ValueError):
            pass
        # A first run counts from the start of the history list and from now.
        return {"real_rows": 0, "at": time.time(), "trained_offset": 0}

    def _save_state(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name("retrain.json.tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(self.state_path)

    def due(self, now: float, real_rows: int) -> str | None:
        """Why a retrain is due now, or None."""
        new = real_rows - int(self.state.get("real_rows", 0))
        if new >= self.policy.every_rows:
            return f"{new} new history rows (every {self.policy.every_rows})"
        hours = (now - float(self.state.get("at", now))) / 3600
        if new > 0 and hours >= self.policy.every_hours:
            return f"{hours:.1f} h since the last retrain and {new} new rows"
        return None

    def tick(self, now: float, real_rows: int) -> list[dict[str, Any]]:
        """Called every leader step: events of a retrain that started or ended."""
        if self.running is not None:
            if self.running.proc.poll() is None:
                return []
            return [self._finish()]
        if now - self._checked_at < self.policy.check_s:
            return []
        self._checked_at = now
        why = self.due(now, real_rows)
        return [] if why is None else [self._start(now, real_rows, why)]

    def _start(self, now: float, real_rows: int, why: str) -> dict[str, Any]:
        self.dir.mkdir(parents=True, exist_ok=True)
        job_path, result_path = self.dir / "retrain-job.json", self.dir / "retrain-result.json"
        log_path = self.dir / "retrain.log"
        result_path.unlink(missing_ok=True)
        job = {
            "artifact": str(self.artifact),
            "prefix": self.policy.prefix,
            "data": list(self.policy.data),
            "folds": self.policy.folds,
            "trained_offset": int(self.state.get("trained_offset", 0)),
            "result": str(result_path),
        }
        job_path.write_text(json.dumps(job, indent=1), encoding="utf-8")
        env = dict(os.environ, **self.policy.env, SNUGFIT_REDIS_URL=self.policy.redis_url)
        with log_path.open("ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler.service._retrain_child", str(job_path)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                # Its own session: a Ctrl-C meant for the scheduler does not kill a retrain
                # halfway (it writes by rename, so stopping it is safe anyway).
                start_new_session=True,
            )
        self.running = _Running(proc, now, real_rows, job_path, result_path, log_path)
        log.warning("retraining the learned tier (pid %d): %s", proc.pid, why)
        return event("retrain", None, phase="started", reason=why, pid=proc.pid)

    def _finish(self) -> dict[str, Any]:
        run = self.running
        assert run is not None
        self.running = None
        code = run.proc.returncode
        try:
            result = json.loads(run.result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = {
                "accepted": False,
                "reason": f"retrain process exited with code {code} and no result; "
                f"see {run.log_path}",
            }
        # Rows counted whatever the outcome: a rejected retrain waits for N more rows. The
        # artifact's training offset moves only when it was replaced.
        self.state["real_rows"] = run.real_rows
        self.state["at"] = run.started_at
        if result.get("accepted"):
            self.state["trained_offset"] = int(result.get("history_offset", 0))
            self.state["version"] = result.get("version")
        self._save_state()
        fields = {k: v for k, v in result.items() if k not in ("accepted", "reason")}
        verdict = "accepted" if result.get("accepted") else "rejected"
        log.warning("retrain %s: %s", verdict, result.get("reason"))
        return event(
            "retrain",
            None,
            phase=verdict,
            accepted=bool(result.get("accepted")),
            reason=str(result.get("reason", "")),
            exit_code=code,
            **fields,
        )

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until a running retrain ends (tests, shutdown); True if none is left."""
        if self.running is None:
            return True
        try:
            self.running.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
