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
