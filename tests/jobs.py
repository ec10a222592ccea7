"""Job specs shared by the service, fault and worker tests."""

from __future__ import annotations

from typing import Any


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
