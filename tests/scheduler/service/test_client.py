"""Client: validated, predicted, idempotent submission; handles read the record back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.exceptions import SpecError
from predictor.gpus import GPU_NAMES
from scheduler.exceptions import JobFailedError, JobNotFoundError, ServiceError
from scheduler.service.client import Client
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import RequestRecord
from tests.jobs import inference_spec as spec


def test_submit_writes_a_pending_record_with_predictions_for_every_gpu(store: Store) -> None:
    client = Client(store=store)
    h = client.submit(spec())
    assert h.id == "job-0"
    assert h.status() == "pending"
    preds = h.prediction
    assert set(preds) == set(GPU_NAMES)
    assert preds["H100-80GB"].peak_vram_upper_gib >= preds["H100-80GB"].peak_vram_gib > 0
    rec = h.record()
    req = RequestRecord.model_validate_json(rec["request"])
    assert req.vram_upper_gib[GPU_NAMES.index("H100-80GB")] == pytest.approx(
        preds["H100-80GB"].peak_vram_upper_gib, rel=1e-3
    )
    assert h.placement is None and h.outcome is None
    assert [j.id for j in client.jobs("pending")] == ["job-0"]


def test_submit_is_idempotent_on_id(store: Store) -> None:
    client = Client(store=store)
    a = client.submit(spec(1))
    b = client.submit(spec(1))
    assert a.id == b.id
    assert len(client.jobs()) == 1


def test_resubmitting_an_id_with_another_spec_is_an_error(store: Store) -> None:
    client = Client(store=store)
    client.submit(spec(1))
    with pytest.raises(ServiceError, match="'job-1' already exists with a different spec"):
        client.submit(spec(1, batch_size=16))
    assert json.loads(client.get("job-1").record()["spec"])["batch_size"] == 8


def test_an_empty_job_file_is_an_error(tmp_path: Path, store: Store) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(ServiceError, match="holds no jobs"):
        Client(store=store).submit_many([f])


def test_jobs_without_id_get_one(store: Store) -> None:
    handles = Client(store=store).submit_many([{k: v for k, v in spec().items() if k != "id"}] * 3)
    assert len({h.id for h in handles}) == 3


def test_invalid_spec_is_rejected_before_anything_is_written(store: Store) -> None:
    client = Client(store=store)
    with pytest.raises(SpecError):
        client.submit(spec(seq_len=-1, bogus_field=1))
    assert client.jobs() == []


def test_submit_from_a_file(tmp_path: Path, store: Store) -> None:
    p = tmp_path / "jobs.jsonl"
    p.write_text("\n".join(json.dumps(spec(i)) for i in range(3)) + "\n")
    client = Client(store=store)
    assert [h.id for h in client.submit_many([p])] == ["job-0", "job-1", "job-2"]
    with pytest.raises(ServiceError, match="submit_many"):
        client.submit(p)


def test_get_unknown_job_raises(store: Store) -> None:
    with pytest.raises(JobNotFoundError):
        Client(store=store).get("nope")


def test_cancel_pending_and_wait_reraises_with_reason(store: Store) -> None:
    client = Client(store=store)
    h = client.submit(spec())
    assert h.cancel() == "cancelled"
    assert h.status() == "cancelled"
    with pytest.raises(JobFailedError, match="cancelled by user"):
        h.wait(timeout=1)
    assert h.cancel() == "cancelled"  # already final: reports the state, changes nothing


def test_wait_times_out_on_a_pending_job(store: Store) -> None:
    h = Client(store=store).submit(spec())
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.1, poll_s=0.02)


def test_unknown_state_filter_is_an_error(store: Store) -> None:
    with pytest.raises(ServiceError, match="unknown job state"):
        Client(store=store).jobs("nonsense")


def test_pool_is_empty_before_a_scheduler_and_filled_after(store: Store) -> None:
    from scheduler.core.pool import load_pool
    from scheduler.service.leader import SchedulerService

    client = Client(store=store)
    assert client.pool()["gpus"] == []
    client.submit(spec())
    SchedulerService(store, load_pool("datasets/pools/small.toml")).step()
    view = client.pool()
    assert view["name"] == "small" and len(view["gpus"]) == 14
    assert list(view["jobs"]) == ["job-0"]
    assert sum(g["used_mib"] for g in view["gpus"]) > 0


def test_corrupt_record_fields_raise_service_error(store: Store) -> None:
    client = Client(store=store)
    h = client.submit(spec())
    store.set_fields(h.id, {"placement": "{not json", "outcome": json.dumps({"x": 1})})
    with pytest.raises(ServiceError, match="not valid JSON"):
        _ = h.placement
    with pytest.raises(ServiceError, match="schema"):
        _ = h.outcome
