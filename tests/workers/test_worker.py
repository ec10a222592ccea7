"""Worker: one queue, JSON only, argv execution, outcome + history, OOM requeue, cancel."""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import queue_name
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from workers.process import detect_oom
from workers.simulated import SimulatedRun
from workers.worker import NodeWorker

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})


def make_worker(store: RedisStore, tmp_path: Path, **kw: Any) -> NodeWorker:
    kw.setdefault("simulate", True)
    kw.setdefault("time_scale", 1e-4)
    kw.setdefault("pool", POOL)
    return NodeWorker(
        store,
        "n1",
        heartbeat_s=0.05,
        history_path=tmp_path / "h.jsonl",
        log_path=tmp_path / "log.jsonl",
        **kw,
    )


def drain(w: NodeWorker) -> None:
    """What the issue asks for: SimpleWorker on the node's one queue, JSON serializer, burst."""
    from workers.execute import set_context

    set_context(w.ctx)
    try:
        worker = SimpleWorker(
            [w.queue],
            connection=w.store.raw,
            serializer=JSONSerializer,
            job_class=w.rq_worker().job_class,
        )
        worker.work(burst=True)
    finally:
        set_context(None)


def test_simulated_jobs_run_measure_and_release(store: RedisStore, tmp_path: Path) -> None:
    client = Client(store=store)
    client.submit_many([spec(i) for i in range(3)])
    svc = SchedulerService(store, POOL)
    w = make_worker(store, tmp_path)
    for _ in range(3):  # two GPUs, three jobs: the third runs once capacity comes back
        svc.step()
        drain(w)
    for h in client.jobs():
        assert h.status() == "succeeded", h.reason
        o = h.outcome
        assert o is not None and o.simulated and o.exit_code == 0 and o.peak_vram_gib
        assert "[simulated]" in h.logs()
        assert h.record().get("simulated") == "1"  # as keys.py documents
    finished = [e for _, e in store.events() if e["event"] == "finished"]
    assert len(finished) == 3
    for e in finished:  # the log line says where the job ran and what it cost
        assert e["option"]["gpu_type"] == "H100-80GB" and e["simulated"] is True
    assert store.alloc_ids() == []
    rows = [json.loads(x) for x in store.history()]
    assert len(rows) == 3 and all(r["simulated"] and r["origin"] == "history" for r in rows)
    file_rows = (tmp_path / "h.jsonl").read_text().splitlines()
    assert len(file_rows) == 3
    from predictor.measurements import load_measurements

    assert load_measurements(tmp_path / "h.jsonl") == []  # simulated rows never train
    assert len(load_measurements(tmp_path / "h.jsonl", include_simulated=True)) == 3


def test_real_command_runs_as_argv_with_cuda_env(store: RedisStore, tmp_path: Path) -> None:
    code = (
        "import os,sys; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES']); "
        "print('arg=' + sys.argv[1]); sys.exit(0)"
    )
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", code, "$(rm -rf /); echo"]))
    SchedulerService(store, POOL).step()
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert h.status() == "succeeded", h.reason
    logs = h.logs()
    assert "CVD=0" in logs or "CVD=1" in logs
    assert "arg=$(rm -rf /); echo" in logs  # argv, never a shell
    assert h.outcome is not None and not h.outcome.simulated


def test_failing_command_fails_with_exit_code(store: RedisStore, tmp_path: Path) -> None:
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", "import sys; sys.exit(3)"]))
    SchedulerService(store, POOL).step()
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert h.status() == "failed" and "exit code 3" in h.reason
    assert store.alloc_ids() == []


def test_oom_in_output_requeues_on_a_bigger_slot(store: RedisStore, tmp_path: Path) -> None:
    # The H100 node is cheaper for this job; after an OOM with the whole 80 GB it must go to
    # the H200 (a bigger type), not back to another H100.
    two = Pool.from_dict(
        {
            "name": "two",
            "nodes": [
                {"name": "n1", "gpu": "H100-80GB", "count": 2},
                {"name": "n2", "gpu": "H200-141GB", "count": 1},
            ],
        }
    )
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory.'); sys.exit(1)"
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", code]))
    svc = SchedulerService(store, two)
    svc.step()
    first = h.placement
    assert first is not None and first.node == "n1"
    drain(make_worker(store, tmp_path, simulate=False, nvml=None, pool=two))
    assert h.status() == "pending"
    # It died at the whole GPU's 80 GiB, so its peak was above that: the new reservation is
    # above the limit (the shared rule), not just 1.25x the old reservation.
    assert float(h.record()["reserved_gib"]) > first.capacity_gib
    assert h.record()["ooms"] == "1"
    assert "bigger GPU type" in (h.reason or "")
    kinds = [e["event"] for _, e in store.events()]
    assert "oom" in kinds and "requeued" in kinds
    rows = [json.loads(x) for x in store.history()]
    assert rows[-1]["oom"] is True
    assert rows[-1]["hardware"]["limit_gib"] == pytest.approx(first.capacity_gib, abs=1e-3)
    svc.step()
    assert h.placement is not None and h.placement.gpu_type == "H200-141GB"


def test_oom_with_nothing_bigger_fails_at_once(store: RedisStore, tmp_path: Path) -> None:
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory.'); sys.exit(1)"
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", code]))
    SchedulerService(store, POOL).step()
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert h.status() == "failed"
    assert "nothing bigger exists" in (h.reason or "") and "ooms" not in h.record()
    assert store.alloc_ids() == []


def test_detect_oom_from_text_or_nvml() -> None:
    assert detect_oom("RuntimeError: CUDA out of memory. Tried", 1, None, 80)
    assert detect_oom("", 1, 79.5, 80)
    assert not detect_oom("CUDA out of memory", 0, None, 80)
    assert not detect_oom("segfault", 139, 10.0, 80)


def test_cancel_stops_a_running_process(store: RedisStore, tmp_path: Path) -> None:
    code = "import time; print('started', flush=True); time.sleep(60)"
    client = Client(store=store)
    h = client.submit(spec(0, [sys.executable, "-c", code]))
    SchedulerService(store, POOL).step()
    w = make_worker(store, tmp_path, simulate=False, nvml=None)
    w.ctx.kill_grace_s = 1.0
    got: list[str] = []

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 10
        while h.status() != "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        got.append(h.cancel())

    # RQ installs signal handlers, so the worker runs in the main thread and the user cancels
    # from another one.
    t = threading.Thread(target=cancel_when_running)
    t.start()
    t0 = time.monotonic()
    drain(w)
    t.join()
    assert got == ["requested"]
    assert time.monotonic() - t0 < 30
    assert h.status() == "cancelled"
    assert store.alloc_ids() == []


def test_hostile_rq_jobs_are_refused_not_executed(store: RedisStore, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    q = Queue(queue_name("n1"), connection=store.raw, serializer=JSONSerializer)
    # A foreign function with JSON args: RQ would import and call it; the allow-list refuses.
    q.enqueue("os.system", f"touch {marker}")
    # Pickle bytes where the JSON payload belongs.
    import pickle

    job = q.enqueue("workers.execute.run_job", "x", 1)
    store.raw.hset(
        f"rq:job:{job.id}", "data", zlib.compress(pickle.dumps(("os.system", None, [], {})))
    )
    # Unknown job id and bad argument types for the real function.
    q.enqueue("workers.execute.run_job", "no-such-job", 1)
    q.enqueue("workers.execute.run_job", {"evil": True}, "1")
    # A job id pushed onto the queue with no job hash behind it.
    store.raw.rpush(f"rq:queue:{queue_name('n1')}", "ghost")
    drain(make_worker(store, tmp_path))
    assert not marker.exists()
    events = [e for _, e in store.events()]
    assert sum(e["event"] == "invalid" for e in events) >= 3
    assert store.alloc_ids() == []


def test_rq_jobs_carrying_callbacks_are_refused_and_nothing_is_imported(
    store: RedisStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys as _sys

    _sys.modules.pop("this", None)
    h = Client(store=store).submit(spec(0, [_sys.executable, "-c", "print('ran')"]))
    SchedulerService(store, POOL).step()
    assert h.placement is not None
    rq_id = h.placement.rq_job_id
    # What an attacker with Redis write access adds to the placed job's RQ hash.
    store.raw.hset(
        f"rq:job:{rq_id}",
        mapping={
            "failure_callback_name": "builtins.print",
            "success_callback_name": "this.s",
            "stopped_callback_name": "this.d",
        },
    )
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert "this" not in _sys.modules  # `import this` prints the Zen of Python on import
    assert "rq:job" not in capsys.readouterr().out  # builtins.print(job, ...) never ran
    invalid = [e for _, e in store.events() if e["event"] == "invalid"]
    assert any("callback" in e["reason"] for e in invalid), invalid
    assert h.status() == "placed"  # refused before run_job: the command never ran


def test_worker_registers_its_gpus_from_the_pool(store: RedisStore, tmp_path: Path) -> None:
    w = make_worker(store, tmp_path)
    w.register()
    info = store.nodes()["n1"]
    gpus = json.loads(info["gpus"])
    assert [g["name"] for g in gpus] == ["H100-80GB", "H100-80GB"]
    assert info["simulated"] == "1"


def test_node_worker_runs_its_placed_jobs_concurrently(store: RedisStore, tmp_path: Path) -> None:
    # Each job waits for the other's marker file: only a worker that runs both at once can
    # finish them (a one-at-a-time worker would time the first one out with exit code 3).
    def rendezvous(me: str, other: str) -> list[str]:
        code = (
            "import pathlib,sys,time; d=pathlib.Path(sys.argv[1]); (d/sys.argv[2]).touch(); "
            "t=time.monotonic()\n"
            "while not (d/sys.argv[3]).exists():\n"
            "    time.sleep(0.01)\n"
            "    if time.monotonic()-t > 30: sys.exit(3)\n"
        )
        return [sys.executable, "-c", code, str(tmp_path), me, other]

    client = Client(store=store)
    hs = client.submit_many([spec("a", rendezvous("a", "b")), spec("b", rendezvous("b", "a"))])
    SchedulerService(store, POOL).step()
    assert all(h.status() == "placed" for h in hs)
    w = make_worker(store, tmp_path, simulate=False, nvml=None)
    w.work(burst=True)  # burst: returns once the queue is empty and every job has ended
    assert [h.status() for h in hs] == ["succeeded", "succeeded"], [h.reason for h in hs]
    assert w.ctx.running() == []
    assert store.alloc_ids() == []


def test_mig_slice_is_exposed_by_its_mig_uuid(store: RedisStore, tmp_path: Path) -> None:
    from scheduler.service.store.records import PlacementRecord
    from workers.execute import _env_for
    from workers.nvml import FakeGpu, FakeNvml

    gpus = [FakeGpu(uuid=f"GPU-aaaaaaaa-0000-0000-0000-00000000000{i}") for i in range(2)]
    gpus[1].mig = [("1g.10gb", 0, 10 << 30), ("3g.40gb", 4, 40 << 30)]
    w = make_worker(store, tmp_path, simulate=False, nvml=FakeNvml(gpus))
    p = PlacementRecord(
        attempt=1,
        node="n1",
        queue=queue_name("n1"),
        rq_job_id="job-0@1",
        label="H100-80GB 3g.40gb",
        kind="mig",
        gpu_type="H100-80GB",
        gpu_indices=[1],
        mig_profile="3g.40gb",
        mig_start=4,
        reserved_gib=30.0,
        capacity_gib=40.0,
        placed_at=0.0,
        policy="bestfit",
    )
    env = _env_for(w.ctx, p)
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["CUDA_VISIBLE_DEVICES"] == w.ctx.mig_uuids[(1, "3g.40gb", 4)]
    assert env["CUDA_VISIBLE_DEVICES"] != w.ctx.mig_uuids[(1, "1g.10gb", 0)]


def _simulated_run(
    job_id: str, attempt: int, peak_gib: float, runtime_s: float, time_scale: float
) -> SimulatedRun:
    """A simulated job of fingerprint ``fp`` (seed 0) on an 80 GiB slot."""
    return SimulatedRun(
        job_id,
        attempt,
        fingerprint="fp",
        seed=0,
        predicted_peak_gib=peak_gib,
        predicted_runtime_s=runtime_s,
        limit_gib=80.0,
        time_scale=time_scale,
        label="t",
    )


def test_simulated_truth_is_the_same_for_every_attempt() -> None:
    runs = [_simulated_run("job-x", attempt, 40.0, 100.0, 0.0) for attempt in (1, 2, 3)]
    assert len({r.true_peak_gib for r in runs}) == 1
    assert len({r.true_runtime_s for r in runs}) == 1


def test_simulated_worker_draws_the_simulators_truth() -> None:
    # One ground truth: a --simulate worker and the simulator give a job the same factors.
    from predictor.analytical import predict_table
    from predictor.history import fingerprint
    from scheduler.core.pool import load_pool
    from scheduler.policies.registry import get_policy
    from scheduler.sim.simulator import Simulator
    from scheduler.sim.workload import generate_workload
    from workers.simulated import true_factors

    wl = generate_workload(0.5, 3, max_jobs=40)
    pool = load_pool(Path(__file__).resolve().parents[2] / "datasets/pools/mixed.toml")
    sim = Simulator(pool, get_policy("rightsize"), wl, predict_table(list(wl.specs)), seed=3)
    for job_spec in wl.specs:
        assert job_spec.id is not None
        job = sim.jobs[job_spec.id]
        vf, rf = true_factors(3, fingerprint(job_spec), job_spec.id)
        assert (vf, rf) == (job.vram_factor, job.runtime_factor)


def test_cancelled_simulated_run_records_the_time_it_ran() -> None:
    run = _simulated_run("job-c", 1, 1.0, 1e6, 1.0)
    run.start()
    run.stop()
    res = run.result()
    assert res.runtime_s < 5.0  # not its planned 1e6 s


def test_job_without_command_on_a_real_worker_fails_with_the_reason(
    store: RedisStore, tmp_path: Path
) -> None:
    h = Client(store=store).submit(spec(0))  # no command
    SchedulerService(store, POOL).step()
    drain(make_worker(store, tmp_path, simulate=False, nvml=None))
    assert h.status() == "failed"
    assert "no `command`" in h.reason and "--simulate" in h.reason
    assert store.history() == []  # nothing was measured


def test_simulated_run_is_labelled_simulated_on_placement_and_outcome(
    store: RedisStore, tmp_path: Path
) -> None:
    h = Client(store=store).submit(spec(0))
    SchedulerService(store, POOL).step()  # a real (not --simulated) scheduler placed it
    drain(make_worker(store, tmp_path))
    assert h.status() == "succeeded"
    assert h.placement is not None and h.outcome is not None
    assert h.placement.simulated is True and h.outcome.simulated is True


def test_a_new_attempt_clears_the_old_requeue_reason(store: RedisStore, tmp_path: Path) -> None:
    h = Client(store=store).submit(spec(0))
    svc = SchedulerService(store, POOL, placement_lease_s=0.0)
    svc.step()
    svc._placement_checked_at = 0.0
    svc.step()  # never started within the (zero) placement lease: requeued with a reason
    assert "never started" in h.reason
    svc.placement_lease_s = 120.0
    svc.step()
    drain(make_worker(store, tmp_path))
    assert h.status() == "succeeded"
    assert h.reason == ""
