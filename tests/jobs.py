"""Job specs and model architectures shared by the service, fault, worker, simulator and
traced-tier tests."""

from __future__ import annotations

from typing import Any

#: A two-layer llama small enough to trace on a CPU in seconds (the traced tier's tests).
TINY_LLAMA: dict[str, Any] = {
    "name": "tiny-llama",
    "n_layers": 2,
    "hidden_size": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
#: The same body with every head its own KV head (plain multi-head attention).
TINY_MHA: dict[str, Any] = {**TINY_LLAMA, "name": "tiny-mha", "n_kv_heads": 4}

#: 70B in fp8, batch 1: ~70 GiB per GPU predicted at TP=1, so one H100 holds the prediction
#: and a true peak above it OOMs (the OOM-escalation tests).
BIG_70B_FP8: dict[str, Any] = {
    "model": "llama-3.1-70b",
    "task": "inference",
    "weight_dtype": "fp8",
    "batch_size": 1,
    "input_len": 512,
    "output_len": 64,
    "num_requests": 4,
}


def inference_spec(i: int | str = 0, command: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    """A small llama-3.1-8b inference job with id ``job-{i}``; ``kw`` overrides any field."""
    d: dict[str, Any] = {
        "id": f"job-{i}",
        "model": "llama-3.1-8b",
        "task": "inference",
        "batch_size": 8,
        "input_len": 512,
        "output_len": 128,
        "num_requests": 100,
    }
    if command is not None:
        d["command"] = command
    d.update(kw)
    return d


def submit_stream(
    url: str, stop: Any, acked: list[str], *, batch: int, pause_s: float = 0.0
) -> None:
    """Submit batches of inference jobs to ``url`` until ``stop`` is set, appending the ids of
    acknowledged ones to ``acked``. A batch that fails on a Redis error is not acknowledged and
    is retried under the same ids (submission is idempotent), as a client would."""
    import time

    import redis

    from scheduler.service.client import Client
    from scheduler.service.store.redis_store import RedisStore

    client = Client(store=RedisStore(redis.Redis.from_url(url, socket_timeout=2)))
    i = 0
    while not stop.is_set():
        try:
            handles = client.submit_many([inference_spec(f"{i}-{k}") for k in range(batch)])
        except (redis.RedisError, OSError):
            time.sleep(0.05)
            continue
        acked.extend(h.id for h in handles)
        i += 1
        if pause_s:
            time.sleep(pause_s)


def one_waiting_for_capacity(store: Any) -> str:
    """On a one-H100 pool, a first job placed and a second left pending for capacity by a live
    leader, which stores no decision for it (it re-decides it each step): the second's id."""
    from scheduler.core.pool import Pool
    from scheduler.service.client import Client
    from scheduler.service.leader import SchedulerService

    one = Pool.from_dict({"name": "one", "nodes": [{"name": "h", "gpu": "H100-80GB", "count": 1}]})
    svc, client = SchedulerService(store, one), Client(store=store)
    first = client.submit(inference_spec("first"))
    svc.step()
    assert first.status() == "placed"
    waiting = client.submit(inference_spec("waiting"))
    svc.step()
    assert waiting.status() == "pending"
    assert store.get_fields([waiting.id], ["decision"])[0] == [None]  # the leader stores none
    return waiting.id


def gang_finetune_spec(job_id: str, *, steps: int = 1000, **kw: Any) -> dict[str, Any]:
    """Llama-3.1-8B full fine-tune over 16 GPUs at TP 8 (two 8-GPU nodes): the multi-node gang
    the inter-node runtime tests price; ``kw`` adds or overrides fields (PP, accumulation)."""
    return {
        "id": job_id,
        "model": "llama-3.1-8b",
        "task": "full_finetune",
        "batch_size": 4,
        "seq_len": 2048,
        "steps": steps,
        "n_gpus": 16,
        "tensor_parallel": 8,
        **kw,
    }
