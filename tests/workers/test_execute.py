"""run_job's execution rules: the job's own environment, workdir and time limit; no MIG
fallback to the whole GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from predictor.exceptions import SpecError
from predictor.spec import parse_spec
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from workers.worker import NodeWorker

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1}]})
MIG_POOL = Pool.from_dict(
    {
        "name": "mig",
        "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1, "mode": "mig", "mig": "dynamic"}],
    }
)
DUMP_ENV = "import json, os; print('ENV=' + json.dumps([os.getcwd(), dict(os.environ)]))"


def run_one(store: RedisStore, tmp_path: Path, job: dict, pool: Pool = POOL, **kw):  # type: ignore[no-untyped-def]
    h = Client(store=store).submit(job)
    SchedulerService(store, pool).step()
    assert h.status() == "placed", h.reason
    kw.setdefault("nvml", None)
    w = NodeWorker(store, "n1", pool=pool, heartbeat_s=0.05, log_path=tmp_path / "l.jsonl", **kw)
    w.ctx.kill_grace_s = 0.5
    w.work(burst=True)
    return h


def test_the_job_gets_its_own_env_not_the_workers(
    store: RedisStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNUGFIT_REDIS_URL", "redis://:hunter2@10.0.0.1:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    job = spec(0, [sys.executable, "-c", DUMP_ENV], env={"HF_HOME": "/data/hf"})
    job["workdir"] = str(tmp_path)
    h = run_one(store, tmp_path, job)
    assert h.status() == "succeeded", h.reason
    line = next(x for x in h.logs().splitlines() if x.startswith("ENV="))
    cwd, env = json.loads(line[4:])
    assert cwd == str(tmp_path)
    assert env["HF_HOME"] == "/data/hf"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["SNUGFIT_JOB_ID"] == "job-0-a1"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and "HOME" in env
    assert "SNUGFIT_REDIS_URL" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "hunter2" not in line


def test_time_limit_stops_the_job_and_says_so(store: RedisStore, tmp_path: Path) -> None:
    code = "import time; print('up', flush=True); time.sleep(120)"
    h = run_one(store, tmp_path, spec(0, [sys.executable, "-c", code], time_limit_s=0.5))
    assert h.status() == "failed"
    assert h.reason.startswith("time limit"), h.reason
    assert h.outcome is not None and h.outcome.runtime_s is not None
    assert h.outcome.runtime_s < 30 and not h.outcome.oom


def test_a_hostile_env_in_the_record_is_refused_on_the_node(
    store: RedisStore, tmp_path: Path
) -> None:
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", "print(1)"]))
    SchedulerService(store, POOL).step()
    raw = json.loads(h.record()["spec"])
    raw["env"] = {"SNUGFIT_REDIS_URL": "x", "LD_PRELOAD": "/tmp/evil.so"}
    store.set_fields(h.id, {"spec": json.dumps(raw)})
    w = NodeWorker(store, "n1", pool=POOL, nvml=None, heartbeat_s=0.05)
    w.work(burst=True)
    assert h.status() == "failed" and "SNUGFIT_REDIS_URL" in h.reason


def test_a_mig_slice_that_cannot_be_made_fails_the_start_never_the_whole_gpu(
    store: RedisStore, tmp_path: Path
) -> None:
    from workers.nvml import FakeGpu, FakeNvml

    code = "import os; print('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))"
    nvml = FakeNvml([FakeGpu(name="NVIDIA H100 80GB HBM3", total_bytes=80 << 30, mig_mode=True)])

    def denied(index: int, profile: str, start: int) -> str:
        raise PermissionError("NVML_ERROR_NO_PERMISSION: Insufficient Permissions")

    nvml.create_mig = denied  # type: ignore[method-assign]
    h = run_one(store, tmp_path, spec(0, [sys.executable, "-c", code]), MIG_POOL, nvml=nvml)
    assert h.placement is not None and h.placement.kind == "mig"
    assert h.status() == "failed"
    assert "Insufficient Permissions" in h.reason and "whole GPU" in h.reason, h.reason
    assert "CVD=" not in (h.logs() or "")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("env", {"CUDA_VISIBLE_DEVICES": "0"}, "worker sets"),
        ("env", {"1BAD": "x"}, "not a variable name"),
        ("env", ["A=1"], "must be a mapping"),
        ("workdir", "relative/dir", "absolute path"),
        ("time_limit_s", 0, "time_limit_s"),
        ("time_limit_s", 1e12, "time_limit_s"),
    ],
)
def test_execution_fields_are_checked_with_the_fix(field: str, value: object, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_spec(spec(0, **{field: value}))


@pytest.mark.parametrize(
    "predictions", ["[1, 2]", '{"H100-80GB": 3}', '{"H100-80GB": {"peak_vram_gib": "x"}}']
)
def test_predictions_that_are_not_a_mapping_read_as_none_and_the_job_runs(
    store: RedisStore, tmp_path: Path, predictions: str
) -> None:
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", "print('ran')"]))
    SchedulerService(store, POOL).step()
    store.set_fields(h.id, {"predictions": predictions})
    w = NodeWorker(store, "n1", pool=POOL, nvml=None, heartbeat_s=0.05)
    w.work(burst=True)
    assert h.status() == "succeeded", h.reason
    assert "ran" in h.logs()
