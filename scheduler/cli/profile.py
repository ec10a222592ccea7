"""``snugfit profile``: run jobs on the local GPU (or CPU) and append measured rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from scheduler.cli._options import ShippedFile
from scheduler.cli.output import Output, dumps_json, output_options

__all__ = ["profile_command"]


@click.command(name="profile")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=ShippedFile(),
    help="Jobs to run: a JSONL file of JobSpecs or a sweep YAML (datasets/sweeps/*.yaml, "
    "found from any folder).",
)
@click.option(
    "--output",
    "output_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Measured rows (JSONL, datasets/measured schema); jobs with no measurement go to "
    "OUTPUT.skipped.jsonl.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where to run: cuda, cpu, or auto (cuda when torch sees a GPU).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1.0),
    default=120.0,
    show_default=True,
    help="Seconds per job before its child process is killed and the job recorded as timed out.",
)
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Skip jobs already in OUTPUT (default) or start the output files afresh.",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="With --resume, rerun jobs recorded as timed out or crashed.",
)
@click.option(
    "--isolation",
    type=click.Choice(["forkserver", "spawn"]),
    default="forkserver",
    show_default=True,
    help="How each job's child process starts: forkserver (torch preloaded, fast) or spawn "
    "(slower; use it if a library initialises CUDA at import on this machine).",
)
@click.option(
    "--calibrate",
    is_flag=True,
    help="First measure HBM copy bandwidth and bf16 matmul TFLOP/s (~1 min) into "
    "OUTPUT.calibration.json.",
)
@click.option(
    "--calibrate-seconds",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    help="How long the calibration runs.",
)
@output_options(
    table=False,
    json_help="One JSON object per job (its outcome), then the summary object.",
)
def profile_command(
    input_path: Path,
    output_path: Path,
    device: str,
    timeout_s: float,
    resume: bool,
    retry_failed: bool,
    isolation: str,
    calibrate: bool,
    calibrate_seconds: float,
    out: Output,
) -> None:
    """Run each job for real with random-init Hugging Face models and record what it used."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "`snugfit profile` needs the profile extra: pip install 'snugfit[profile]'"
        ) from None
    from predictor.exceptions import PredictorError
    from workers.profile.run import calibration_path, run_calibration, run_profile

    if calibrate:
        cal_path = calibration_path(output_path)
        cal = run_calibration(cal_path, device=device, duration_s=calibrate_seconds)
        if cal.get("status") == "ok":
            click.echo(
                f"calibration ({cal.get('device')}): HBM copy "
                f"{cal['hbm_copy_bandwidth_gbps']:.0f} GB/s, bf16 matmul "
                f"{cal['bf16_matmul_tflops']:.3g} TFLOP/s -> {cal_path}"
            )
        else:
            click.echo(f"calibration failed: {cal.get('message')} (see {cal_path})", err=True)

    def show(job: str, outcome: dict[str, Any]) -> None:
        if out.json:
            out.emit_json({"job": job, **outcome})
            return
        status = outcome.get("status")
        bits = [
            f"{k}={outcome[k]:.4g}"
            for k in ("peak_vram_gib", "step_time_s", "ttft_s", "tpot_s")
            if outcome.get(k) is not None
        ]
        msg = outcome.get("message") if status not in ("ok",) else ""
        first = str(msg or "").splitlines()[0][:160] if msg else ""
        click.echo(f"{job}: {status} {' '.join(bits)} {first}".rstrip())

    try:
        summary = run_profile(
            input_path,
            output_path,
            device=device,
            timeout_s_per_job=timeout_s,
            resume=resume,
            retry_failed=retry_failed,
            on_result=show,
            start_method=isolation,
        )
    except (PredictorError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(dumps_json(summary.as_dict()))
