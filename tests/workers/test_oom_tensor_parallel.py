"""OOM escalation's last step on real Redis: a job no GPU of the pool holds is requeued at
twice the tensor parallelism when its spec permits it (``max_tensor_parallel``), re-placed on
two GPUs and finishes; where nothing bigger exists it fails at once."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predictor.analytical import predict_table
from predictor.history import fingerprint_dict
from predictor.prediction import PredictionTable
from predictor.spec import JobSpec, parse_spec
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import BIG_70B_FP8
from tests.rq_drain import drain
from workers.simulated import true_factors
from workers.worker import NodeWorker

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})
BIG = {"id": "big", **BIG_70B_FP8, "max_tensor_parallel": 2}
OOM = "torch.OutOfMemoryError: CUDA out of memory."


def _predict(specs: Sequence[JobSpec]) -> PredictionTable:
    # The client and the worker's re-prediction share one predictor, as in a deployment.
    return predict_table(list(specs))


def _worker(store: RedisStore, tmp_path: Path, pool: Pool, **kw: Any) -> NodeWorker:
    w = NodeWorker(
        store,
        "n1",
        pool=pool,
        heartbeat_s=0.05,
        time_scale=1e-4,
        history_path=tmp_path / "h.jsonl",
        log_path=tmp_path / "log.jsonl",
        **kw,
    )
    w.ctx.predict = _predict
    return w


def _seed_that_ooms_at_tp1_only() -> int:
    """A truth seed whose draw puts the job over an H100 at TP=1 and well inside its TP=2
    reservation (~50 GiB per GPU): the simulated truth is seeded, so this is deterministic."""
    tp1 = parse_spec(BIG)
    tp2 = parse_spec(BIG | {"tensor_parallel": 2, "n_gpus": 2})
    fp1, fp2 = fingerprint_dict(tp1.to_dict()), fingerprint_dict(tp2.to_dict())
    for seed in range(1000):
        if true_factors(seed, fp1, "big")[0] > 1.2 and true_factors(seed, fp2, "big")[0] < 1.25:
            return seed
    raise AssertionError("no truth seed in 0..999 gives the case")


def test_oom_at_tp1_is_requeued_at_tp2_and_finishes(store: RedisStore, tmp_path: Path) -> None:
    h = Client(store=store, table_fn=_predict).submit(BIG)
    svc = SchedulerService(store, POOL)
    w = _worker(store, tmp_path, POOL, simulate=True, truth_seed=_seed_that_ooms_at_tp1_only())
    svc.step()
    first = h.placement
    assert first is not None and first.gpu_indices and len(first.gpu_indices) == 1
    drain(w)  # the simulated run OOMs with all of one H100
    rec = h.record()
    assert h.status() == "pending" and rec["ooms"] == "1"
    reason = h.reason or ""
    assert "CUDA OOM on H100-80GB x1 at TP=1" in reason and "requeued at TP=2: 2 x" in reason
    # The record carries the new layout, so placement and the worker use it.
    spec = json.loads(rec["spec"])
    request = json.loads(rec["request"])
    assert (spec["tensor_parallel"], spec["n_gpus"], spec["max_tensor_parallel"]) == (2, 2, 2)
    assert (request["tensor_parallel"], request["n_gpus"]) == (2, 2)
    predicted = json.loads(rec["predictions"])["H100-80GB"]["peak_vram_gib"]
    assert predicted < 40  # re-predicted per GPU at TP=2
    assert predicted < float(rec["reserved_gib"]) < first.capacity_gib  # the carried floor
    assert "history_request" not in rec
    assert json.loads(rec["submitted_spec"])["tensor_parallel"] == 1
    # Resubmitting what was submitted stays a no-op, although the record now runs at TP=2.
    assert Client(store=store, table_fn=_predict).submit(BIG).id == "big"
    oom = next(e for _, e in store.events() if e["event"] == "oom")
    assert oom["retry_layout"] == {"tensor_parallel": [1, 2], "n_gpus": [1, 2]}

    svc.step()
    second = h.placement
    assert second is not None and second.attempt == 2 and len(second.gpu_indices) == 2
    assert second.reserved_gib >= float(rec["reserved_gib"])
    drain(w)
    assert h.status() == "succeeded", h.reason
    assert store.alloc_ids() == []
    # The history keeps each layout apart: an OOM floor for TP=1, a measured run for TP=2.
    rows = [json.loads(x) for x in store.history()]
    assert [(r["spec"]["tensor_parallel"], r["oom"]) for r in rows] == [(1, True), (2, False)]
    assert fingerprint_dict(rows[0]["spec"]) != fingerprint_dict(rows[1]["spec"])


def test_the_command_is_told_its_new_degree(store: RedisStore, tmp_path: Path) -> None:
    # A real command that OOMs unless it runs split over two GPUs; it reads its degree from
    # the placeholders and the environment, as a launch script would.
    code = (
        "import os, sys; tp, n = sys.argv[1], sys.argv[2]; "
        "print('tp=' + tp, 'n=' + n, 'env=' + os.environ['SNUGFIT_TENSOR_PARALLEL_SIZE'], "
        "'cvd=' + os.environ['CUDA_VISIBLE_DEVICES']); "
        f"sys.exit(0) if tp == '2' else (print({OOM!r}), sys.exit(1))"
    )
    cmd = [sys.executable, "-c", code, "{tensor_parallel_size}", "{n_gpus}"]
    h = Client(store=store, table_fn=_predict).submit(BIG | {"command": cmd})
    svc = SchedulerService(store, POOL)
    w = _worker(store, tmp_path, POOL, simulate=False, nvml=None)
    svc.step()
    drain(w)
    assert h.status() == "pending" and "requeued at TP=2" in (h.reason or "")
    svc.step()
    drain(w)
    assert h.status() == "succeeded", h.reason
    assert "tp=2 n=2 env=2 cvd=0,1" in h.logs()


def test_nothing_bigger_at_any_permitted_degree_fails_at_once(
    store: RedisStore, tmp_path: Path
) -> None:
    # Two one-GPU nodes: no node holds the two-GPU gang TP=2 needs.
    pool = Pool.from_dict(
        {
            "name": "ones",
            "nodes": [
                {"name": "n1", "gpu": "H100-80GB", "count": 1},
                {"name": "n2", "gpu": "H100-80GB", "count": 1},
            ],
        }
    )
    cmd = [sys.executable, "-c", f"import sys; print({OOM!r}); sys.exit(1)"]
    h = Client(store=store, table_fn=_predict).submit(BIG | {"command": cmd})
    SchedulerService(store, pool).step()
    assert h.placement is not None and h.placement.node == "n1"
    drain(_worker(store, tmp_path, pool, simulate=False, nvml=None))
    assert h.status() == "failed"
    reason = h.reason or ""
    assert "nothing bigger exists, nor at a higher tensor parallel degree" in reason
    assert "no node has 2 GPUs" in reason
    assert "ooms" not in h.record() and store.alloc_ids() == []
    assert json.loads(h.record()["spec"])["tensor_parallel"] == 1  # never re-split


def test_a_predictor_that_breaks_still_records_the_outcome(
    store: RedisStore, tmp_path: Path
) -> None:
    # The attempt's end must be recorded (failed at once, not left to a lapsing lease).
    def broken(specs: Sequence[JobSpec]) -> PredictionTable:
        raise RuntimeError("learned artifact unreadable")

    cmd = [sys.executable, "-c", f"import sys; print({OOM!r}); sys.exit(1)"]
    h = Client(store=store, table_fn=_predict).submit(BIG | {"command": cmd})
    SchedulerService(store, POOL).step()
    w = _worker(store, tmp_path, POOL, simulate=False, nvml=None)
    w.ctx.predict = broken
    drain(w)
    assert h.status() == "failed" and "nothing bigger exists" in (h.reason or "")
    assert store.alloc_ids() == []
