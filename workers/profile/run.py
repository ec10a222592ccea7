"""The profiling harness: run JobSpecs for real, one child process each, and record rows.

``run_profile`` is the sweep loop. It never imports torch itself: every job runs in a fresh
child process (forked from a forkserver that has torch preloaded, so a job starts in
milliseconds, not seconds), and the child reports back over a pipe. A hang hits the per-job
timeout and the child is killed; a CUDA crash ends only the child; an OOM is caught in the child
and comes back as a result. Each outcome is appended to the output file as soon as it is known,
so a sweep stopped at any point resumes where it left off.

Outputs, side by side:

* ``OUTPUT`` (``datasets/measured`` JSONL): one validated row per measured job, OOMs included.
* ``OUTPUT`` with ``.skipped.jsonl``: jobs that produced no measurement (skipped as
  unsupported here, timed out, crashed), with the reason. The measured-row schema requires a
  measured value, and a reason is not one.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.gpus import GPU_NAMES, gpu_catalogue
from predictor.measurements import append_measurement, measurement_row
from predictor.spec import JobSpec, load_specs, parse_spec
from workers.exceptions import ProfileError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ProfileSummary",
    "calibration_path",
    "done_ids",
    "gpu_catalogue_name",
    "job_id",
    "outcome_row",
    "run_calibration",
    "run_profile",
    "skipped_path",
]

DEFAULT_TIMEOUT_S = 120.0
_SOURCE = "snugfit profile harness (workers/profile/run.py): random-init HF model, run for real"

Runner = Callable[[dict[str, Any], str], dict[str, Any]]


@dataclass
class ProfileSummary:
    """What a sweep did: ids per outcome, in run order."""

    measured: list[str] = field(default_factory=list)
    oom: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "measured": len(self.measured),
            "oom": len(self.oom),
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "already_done": len(self.already_done),
            "wall_s": round(self.wall_s, 2),
        }


def skipped_path(output: str | Path) -> Path:
    """Where jobs without a measurement go: ``rows.jsonl`` → ``rows.skipped.jsonl``."""
    p = Path(output)
    return p.with_name(p.name.removesuffix(".jsonl") + ".skipped.jsonl")


def job_id(spec: JobSpec) -> str:
    """The spec's own id, or a stable digest of its content for specs without one."""
    if spec.id:
        return spec.id
    import hashlib

    blob = json.dumps(spec.to_dict(), sort_keys=True).encode()
    return "job-" + hashlib.sha256(blob).hexdigest()[:12]


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill mid-write: that job simply runs again
            if isinstance(obj, dict):
                yield obj


def done_ids(output: str | Path, *, retry_failed: bool = False) -> set[str]:
    """Job ids already recorded in ``output`` or its skipped file.

    With ``retry_failed``, timed-out and crashed jobs count as not done (skips for an
    unsupported feature always count: rerunning them cannot change the answer).
    """
    ids: set[str] = set()
    for row in _read_jsonl(Path(output)):
        spec = row.get("spec")
        sid = spec.get("id") if isinstance(spec, dict) else None
        ids.add(str(sid or row.get("id")))
    for row in _read_jsonl(skipped_path(output)):
        if retry_failed and row.get("status") in ("timeout", "error", "crashed"):
            continue
        ids.add(str(row.get("job_id")))
    return ids


def gpu_catalogue_name(device_name: str | None, memory_gib: float | None) -> str | None:
    """Catalogue name for a device string like "NVIDIA H200" (141 GiB → ``H200-141GB``).

    Matches the family in the name and picks the catalogue memory size nearest the device's;
    None for GPUs outside the catalogue (an L4 is not an A100), so rows never claim a type they
    were not measured on.
    """
    if not device_name:
        return None
    text = device_name.upper()
    families = [n for n in GPU_NAMES if n.split("-")[0] in text]
    if not families:
        return None
    if memory_gib is None or len(families) == 1:
        return families[0] if len(families) == 1 else None
    cat = gpu_catalogue()
    # The driver reserves a few GiB, so "nearest", not "equal": 79.1 GiB on an H100-80GB.
    return min(families, key=lambda n: abs(cat[n].memory_gib - memory_gib))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def outcome_row(spec: JobSpec, outcome: dict[str, Any], *, date: str) -> dict[str, Any] | None:
    """Turn a child's outcome into a validated measured row; None when nothing was measured."""
    status = outcome.get("status")
    if status not in ("ok", "oom"):
        return None
    hw = dict(outcome.get("hardware") or {})
    sw = dict(outcome.get("software") or {})
    on_gpu = outcome.get("device") == "cuda"
    gpu_model = hw.get("gpu_name") if on_gpu else None
    gpu_mem = hw.get("gpu_memory_gib") if on_gpu else None
    gpu = gpu_catalogue_name(gpu_model, gpu_mem) if on_gpu else None
    extras = (
        "torch_max_allocated_gib",
        "torch_max_reserved_gib",
        "nvml_peak_used_gib",
        "nvml_idle_used_gib",
        "cuda_context_gib",
        "nvml_samples",
        "cpu_max_rss_gib",
        "model_build_s",
        "wall_s",
        "params_built",
        "params_arch",
        "params_trainable",
        "precision",
        "attn_implementation",
        "optimizer_impl",
        "lora_target_modules",
        "lora_params_arch",
        "steps_run",
        "step_times_s",
        "tokens_generated",
        "loss",
    )
    for key in extras:
        if outcome.get(key) is not None:
            value = outcome[key]
            hw[key] = round(value, 6) if isinstance(value, float) else value
    notes: list[str] = []
    if on_gpu:
        notes.append(
            "peak_vram_gib = NVML used peak (5 ms sampling) minus the device's used memory "
            "before this process created its CUDA context, so it includes the context; "
            "torch allocator peaks are in hardware.torch_max_*"
        )
    else:
        notes.append(
            f"CPU run ({hw.get('cpu') or 'unknown cpu'}): no VRAM measured, times are CPU "
            "times and say nothing about any GPU"
        )
    if status == "oom":
        notes.append(f"OOM: {outcome.get('message')}; peak_vram_gib is a lower bound")
    if outcome.get("runtime_s") is None:
        notes.append("runtime_s null: the profiler timed a few steps/one batch, not the whole job")
    notes.extend(str(n) for n in outcome.get("notes") or [])
    peak = outcome.get("peak_vram_gib") if on_gpu else None
    date_slug = date.replace("-", "")
    device_slug = _slug(gpu or gpu_model or "cpu")
    return measurement_row(
        id=f"prof-{device_slug}-{date_slug}-{job_id(spec)}",
        origin="profile",
        simulated=False,
        source=_SOURCE,
        spec=spec,
        gpu=gpu,
        gpu_model=gpu_model,
        gpu_memory_gib=gpu_mem,
        peak_vram_gib=round(peak, 4) if peak else None,
        measurement="nvml_used" if peak else "unknown",
        step_time_s=_pos(outcome.get("step_time_s")),
        ttft_s=_pos(outcome.get("ttft_s")),
        tpot_s=_pos(outcome.get("tpot_s")),
        runtime_s=_pos(outcome.get("runtime_s")),
        oom=status == "oom",
        confidence="high" if on_gpu and status == "ok" else "low",
        date=date,
        hardware=hw,
        software=sw,
        notes="; ".join(notes),
    )


def _pos(value: Any) -> float | None:
    return round(float(value), 6) if value is not None and float(value) > 0 else None


def _context(start_method: str = "forkserver") -> Any:
    """A forkserver context with torch preloaded: fork is cheap, and the server never touches
    CUDA, so each child gets a clean context (forking a CUDA-initialised parent is unsafe).

    ``spawn`` is the fallback should some preloaded library initialise CUDA at import on a
    given machine: slower (each job imports torch, ~5 s) but with nothing inherited.
    """
    if start_method not in ("forkserver", "spawn"):
        raise ProfileError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    # torch.cuda.is_available() at import time (accelerate, peft) then asks NVML instead of
    # calling cuInit, which would make every forked child's CUDA unusable.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(_PRELOAD))
    return ctx


# Imported once by the forkserver (a missing one is silently skipped by multiprocessing), so
# children start with torch and the common HF model code already loaded (~8 s saved per job).
_PRELOAD = (
    "torch",
    "transformers",
    "transformers.generation.utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.gpt2.modeling_gpt2",
    "peft",
    "workers.profile._job",
)


def _run_isolated(
    ctx: Any, spec_dict: dict[str, Any], device: str, timeout_s: float, runner: Runner
) -> dict[str, Any]:
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=child_main, args=(child, spec_dict, device, runner), name="snugfit-profile-job"
    )
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                result: dict[str, Any] = parent.recv()
            except EOFError:
                result = {}
            proc.join(timeout=30)
            if result:
                return result
            return {
                "status": "crashed",
                "message": f"child process exited with code {proc.exitcode} without a result "
                "(a CUDA fault or a kill); rerun the job alone to see its stderr",
            }
        return {
            "status": "timeout",
            "message": f"no result after {timeout_s:g} s; the child was killed. Raise --timeout "
            "or shrink the job",
        }
    finally:
        parent.close()
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=30)


def run_profile(
    specs: Sequence[JobSpec | dict[str, Any]] | str | Path,
    output_path: str | Path,
    *,
    device: str = "auto",
    timeout_s_per_job: float = DEFAULT_TIMEOUT_S,
    resume: bool = True,
    retry_failed: bool = False,
    runner: Runner | None = None,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    start_method: str = "forkserver",
) -> ProfileSummary:
    """Run every job and append one row per job to ``output_path`` as soon as it finishes.

    ``specs`` is a list of JobSpecs/dicts or a jobs file (.jsonl/.yaml). ``device`` is
    ``cuda``, ``cpu`` or ``auto``. With ``resume`` (default) jobs already recorded are skipped;
    without it both output files are truncated first. ``runner`` replaces the in-child job
    function (a picklable top-level callable); tests use it to force faults. ``on_result`` is
    called with each job id and its outcome, for progress display. ``start_method`` is
    ``forkserver`` (default, fast) or ``spawn`` (see ``_context``).
    """
    if device not in ("auto", "cuda", "cpu"):
        raise ProfileError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    if timeout_s_per_job <= 0:
        raise ProfileError(f"timeout_s_per_job must be positive, got {timeout_s_per_job!r}")
    jobs = load_specs(specs) if isinstance(specs, str | Path) else [parse_spec(s) for s in specs]
    ids = [job_id(s) for s in jobs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ProfileError(f"job ids must be unique in a sweep; repeated: {', '.join(dupes)}")
    out = Path(output_path)
    side = skipped_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        for p in (out, side):
            if p.exists():
                p.unlink()
    for p in (out, side):
        _drop_torn_tail(p)
    done = done_ids(out, retry_failed=retry_failed) if resume else set()
    if runner is None:
        from workers.profile._job import run_job

        runner = run_job
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    ctx = _context(start_method)
    summary = ProfileSummary()
    t0 = time.perf_counter()
    for spec, jid in zip(jobs, ids, strict=True):
        if jid in done:
            summary.already_done.append(jid)
            continue
        spec_dict = {**spec.to_dict(), "id": jid}
        outcome = _run_isolated(ctx, spec_dict, device, timeout_s_per_job, runner)
        date = dt.date.today().isoformat()
        row = outcome_row(parse_spec(spec_dict), outcome, date=date)
        if row is not None:
            append_measurement(out, row)
            (summary.oom if row["oom"] else summary.measured).append(jid)
        else:
            status = str(outcome.get("status"))
            _append_line(
                side,
                {
                    "job_id": jid,
                    "status": status,
                    "reason": outcome.get("message") or "no measurement came back",
                    "device": outcome.get("device", device),
                    "date": date,
                    "spec": spec_dict,
                },
            )
            (summary.skipped if status == "skipped" else summary.failed).append(jid)
        if on_result is not None:
            on_result(jid, outcome)
    summary.wall_s = time.perf_counter() - t0
    return summary


def child_main(conn: Any, spec_dict: dict[str, Any], device: str, runner: Runner) -> None:
    """Entry point of the child process: run the job, send the outcome, exit."""
    try:
        result = runner(spec_dict, device)
    except BaseException as exc:  # run_job never raises; a custom runner may
        result = {"status": "error", "message": f"{type(exc).__name__}: {exc}", "notes": []}
    conn.send(result)
    conn.close()


def run_calibration(
    output_path: str | Path,
    *,
    device: str = "auto",
    duration_s: float = 60.0,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Measure HBM copy bandwidth and bf16 matmul TFLOP/s (about ``duration_s``) in a child
    process and write the result as one JSON object to ``output_path``; returns it."""
    from workers.profile._calibrate import calibrate

    if device not in ("auto", "cuda", "cpu"):
        raise ProfileError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    ctx = _context()
    result = _run_isolated(
        ctx, {"duration_s": duration_s}, device, timeout_s or 3 * duration_s + 120, calibrate
    )
    p = Path(output_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return result


def calibration_path(output: str | Path) -> Path:
    """Where ``--calibrate`` writes: ``rows.jsonl`` → ``rows.calibration.json``."""
    p = Path(output)
    return p.with_name(p.name.removesuffix(".jsonl") + ".calibration.json")


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a kill left half-written, so the next append starts a clean line
    (otherwise the new row would be glued onto the fragment and both would be lost)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    with path.open("r+b") as fh:
        fh.truncate(cut)


def _append_line(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")
        fh.flush()
