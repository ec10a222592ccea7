"""Measure the device's real ceilings: HBM copy bandwidth and bf16 matmul throughput.

The roofline divides by these. Datasheet peaks (4.8 TB/s, 989 TFLOP/s on an H200) are never
reached; the measured ones are what MBU/MFU should be relative to. Runs in the profiler's child
process, like a job.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from typing import Any

__all__ = ["calibrate"]

GIB = 1024**3


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _timed(fn: Any, device: str, budget_s: float, min_reps: int = 3) -> list[float]:
    """Run ``fn`` repeatedly for about ``budget_s``; per-call seconds after one warm-up."""
    fn()
    _sync(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 10_000:
            break
    return times


def calibrate(payload: dict[str, Any], device: str = "auto") -> dict[str, Any]:
    """``payload``: ``{"duration_s": 60}``. Returns a JSON-ready dict; never raises."""
    from workers.profile._job import _resolve_device, environment

    out: dict[str, Any] = {"status": "error", "kind": "calibration"}
    try:
        import torch

        device = _resolve_device(device)
        duration_s = float(payload.get("duration_s", 60.0))
        out["device"] = device
        out["date"] = dt.date.today().isoformat()
        out.update(environment(device))
        on_gpu = device == "cuda"
        # 2 GiB buffers defeat the H200's 50 MB L2; small on CPU so the smoke test is quick.
        copy_bytes = 2 * GIB if on_gpu else 64 * 1024**2
        src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
        dst = torch.empty_like(src)
        t_copy = _timed(lambda s=src, d=dst: d.copy_(s), device, duration_s * 0.4)
        # A copy reads and writes every byte once: 2 × size crosses the memory bus.
        out["hbm_copy_bandwidth_gbps"] = 2 * copy_bytes / statistics.median(t_copy) / 1e9
        out["hbm_copy_bandwidth_gbps_best"] = 2 * copy_bytes / min(t_copy) / 1e9
        out["copy_bytes"] = copy_bytes
        del src, dst
        results = {}
        sizes = (4096, 8192) if on_gpu else (256, 512)
        for n in sizes:
            a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
            b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
            t_mm = _timed(lambda a=a, b=b: a @ b, device, duration_s * 0.6 / len(sizes))
            results[str(n)] = 2 * n**3 / statistics.median(t_mm) / 1e12
        out["bf16_matmul_tflops_by_n"] = results
        out["bf16_matmul_tflops"] = max(results.values())
        out["duration_s"] = duration_s
        out["status"] = "ok"
        if not on_gpu:
            out["notes"] = "CPU calibration: says nothing about any GPU"
    except Exception as exc:
        out["message"] = f"{type(exc).__name__}: {exc}"
    return out
