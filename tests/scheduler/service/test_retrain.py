"""Periodic retraining on real Redis: the leader starts a retraining process every N new history
rows, the new artifact replaces the old one only when grouped CV says it is no worse, and the
next prediction names the new version.

The published rows are the 64 peak-VRAM rows of ``datasets/measured/published.jsonl`` (so a
retrain takes seconds). The new history rows are 24 of those runs (of the 39 on catalogue
GPUs, where a worker can run) measured again, as workers on two nodes would append them:
agreeing with the published peaks, or within ±5% of them (accepted), or as nodes with a broken
memory reading would report them: doubled, tripled, 0.4×, contradictory between the nodes, or
randomly 5× / 0.2× (their rows sit far outside the incumbent's calibrated residuals: rejected).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from predictor._retrain_cv import ALPHA
from predictor.artifact import default_artifact_path
from scheduler.cli.render import event_line
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.history_feed import HistoryFeed
from scheduler.service.leader import SchedulerService
from scheduler.service.retrain import Retrainer, RetrainPolicy
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec
from tests.retrain_cases import BROKEN, HONEST, Factor, N, published_vram, remeasured

REPO = Path(__file__).resolve().parents[3]
POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})


def _history_rows(factor: Factor | float, n: int = N, first: int = 0) -> list[str]:
    """``n`` published runs measured again on the cluster, their peaks times ``factor``."""
    f = factor if callable(factor) else (lambda i, node: factor)
    on_catalogue_gpus = [r for r in published_vram() if isinstance(r.get("gpu"), str)]
    runs = on_catalogue_gpus[first : first + n]
    return [remeasured(r, i, f, f"hist-{i}") for i, r in enumerate(runs, first)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A $SNUGFIT_HOME whose active artifact is a copy of the shipped one (as `snugfit train`
    would have left it), so an accepted retrain has one to keep as the previous."""
    h = tmp_path / "home"
    (h / "artifacts").mkdir(parents=True)
    shutil.copy(default_artifact_path(), h / "artifacts" / "learned.json")
    monkeypatch.setenv("SNUGFIT_HOME", str(h))
    return h


def _version(path: Path) -> str:
    return str(json.loads(path.read_text(encoding="utf-8"))["version"])


def _retrain_events(store: RedisStore) -> list[dict[str, Any]]:
    return [e for _, e in store.events() if e.get("event") == "retrain"]


def _service(store: RedisStore, redis_url: str, tmp_path: Path) -> SchedulerService:
    data = tmp_path / "published-vram.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in published_vram()), encoding="utf-8")
    policy = RetrainPolicy(redis_url, every_rows=N, data=(str(data),), check_s=0.0)
    # The test drives step() by hand and waits for the retrain process between steps (tens of
    # seconds on a loaded machine): a 5 s lease would lapse in that wait, and a leader that lost
    # its lease stands by for one step instead of recording the retrain's outcome.
    return SchedulerService(store, POOL, retrain=policy, lease_ttl_s=900.0)


def _run_retrain(svc: SchedulerService) -> dict[str, Any]:
    assert svc.retrainer is not None and svc.retrainer.running is not None
    assert svc.retrainer.wait(timeout_s=600)
    before = len(_retrain_events(svc.store))  # type: ignore[arg-type]
    svc.step()
    got = _retrain_events(svc.store)  # type: ignore[arg-type]
    assert len(got) == before + 1
    return got[-1]


@pytest.mark.parametrize("factor", HONEST.values(), ids=HONEST.keys())
def test_retrain_after_n_rows_is_accepted_and_the_next_prediction_names_it(
    redis_url: str, tmp_path: Path, home: Path, factor: Factor | float
) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    client = Client(store=store)  # long-lived: loaded the old artifact, must follow the new
    old = _version(home / "artifacts" / "learned.json")
    svc = _service(store, redis_url, tmp_path)
    rows = _history_rows(factor)
    for raw in rows[:-1]:
        store.append_history(raw)
    svc.step()
    assert svc.retrainer is not None and svc.retrainer.running is None  # N - 1 rows: not yet
    store.append_history(rows[-1])
    svc.step()
    running = svc.retrainer.running
    assert running is not None and running.proc.pid != os.getpid()  # another process
    started = _retrain_events(store)
    assert [e["phase"] for e in started] == ["started"] and started[0]["pid"] == running.proc.pid
    # The loop keeps placing while the retrain runs.
    h = client.submit(inference_spec("during"))
    svc.step()
    assert h.status() == "placed"

    done = _run_retrain(svc)
    assert done["phase"] == "accepted" and done["accepted"] is True, done["reason"]
    assert done["pid"] == running.proc.pid and done["n_new_rows"] == N
    cv = done["cv"]["peak_vram_gib"]
    assert cv["n_new"] == N and set(cv["nodes"]) == {"snugfit node n0", "snugfit node n1"}
    level = ALPHA / 3  # two node groups and the paired test, Bonferroni
    assert all(t["p"] > level for t in cv["nodes"].values()) and cv["worse_p"] > level
    new = done["version"]
    assert new != old and done["previous_version"] == old
    assert _version(home / "artifacts" / "learned.json") == new
    assert _version(home / "artifacts" / "learned.previous.json") == old  # the old one is kept
    line = event_line(done)  # `snugfit log`
    assert "retrain" in line and "accepted" in line and new in line and "%" in line
    # The next prediction, from the client that was already running, names the new version.
    later = client.submit(inference_spec("after"))
    method = store.get_job(later.id)["method"]  # type: ignore[index]
    assert method.endswith(f":{new}"), method
    # A leader restarted now does not retrain again on the same rows.
    assert Retrainer(svc.retrainer.policy).due(time.time(), N) is None


@pytest.mark.parametrize("broken", BROKEN.values(), ids=BROKEN.keys())
def test_retrain_is_rejected_when_the_new_rows_are_off_the_incumbents_calibration(
    redis_url: str, tmp_path: Path, home: Path, broken: Factor
) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    old = _version(home / "artifacts" / "learned.json")
    svc = _service(store, redis_url, tmp_path)
    for raw in _history_rows(broken):
        store.append_history(raw)
    svc.step()
    done = _run_retrain(svc)
    assert done["phase"] == "rejected" and done["accepted"] is False
    cv = done["cv"]["peak_vram_gib"]
    # Both nodes misread, so both nodes' rows fail the consistency test, and the reason names them.
    assert all(t["p"] <= ALPHA / 3 for t in cv["nodes"].values())
    assert "snugfit node n0" in done["reason"] and "snugfit node n1" in done["reason"]
    assert "calibrated residuals" in done["reason"] and done["version"] is None
    assert _version(home / "artifacts" / "learned.json") == old  # untouched
    assert not (home / "artifacts" / "learned.previous.json").exists()
    method = Client(store=store).submit(inference_spec("after")).record()["method"]
    assert method.endswith(f":{old}"), method
    # The rejected rows still count: the next retrain waits for N more.
    assert svc.retrainer is not None
    assert svc.retrainer.due(time.time(), N) is None
    assert svc.retrainer.due(time.time(), 2 * N) is not None
    assert svc.retrainer.state["trained_offset"] == 0  # the artifact never saw those rows


def test_due_counts_real_rows_and_hours(tmp_path: Path, redis_url: str) -> None:
    policy = RetrainPolicy(redis_url, every_rows=3, every_hours=1.0, artifact=tmp_path / "a.json")
    r = Retrainer(policy)
    now = time.time()
    assert r.due(now, 2) is None
    assert r.due(now, 3) is not None
    r.state.update(real_rows=3, at=now - 7200)
    assert r.due(now, 3) is None  # hours passed, but nothing new to learn from
    assert r.due(now, 4) is not None  # hours passed and one new row
    # Simulated rows never train, so they never count.
    store = RedisStore(redis.Redis.from_url(redis_url))
    sim = json.loads(_history_rows(1.0, n=1)[0])
    store.append_history(json.dumps(dict(sim, simulated=True)))
    store.append_history(_history_rows(1.0, n=1, first=1)[0])
    feed = HistoryFeed(store, include_simulated=True)
    feed.poll()
    assert feed.real_rows == 1
    with pytest.raises(ValueError, match="every_rows"):
        RetrainPolicy(redis_url, every_rows=0)
