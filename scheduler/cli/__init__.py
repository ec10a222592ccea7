"""The ``snugfit`` command line.

Each command lives in its own private module (``scheduler/cli/<name>.py``) exposing a click
command named ``command``; this file only wires them into one group, importing each lazily so
``snugfit predict`` does not pay for Redis, RQ or LightGBM imports it never uses.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

__all__ = ["main"]

# command name -> (module, one-line help shown by `snugfit --help`)
_COMMANDS: dict[str, tuple[str, str]] = {
    "predict": ("scheduler.cli.predict", "Predict peak VRAM and runtime per GPU type (offline)."),
    "models": ("scheduler.cli.predict", "List the model catalogue."),
    "gpus": ("scheduler.cli.predict", "List the GPU catalogue with MIG profiles and prices."),
    "plan": ("scheduler.cli.plan", "Plan an LLM deployment by latency SLO at the lowest cost."),
    "trace": ("scheduler.cli.trace", "Trace jobs on the CPU to warm the traced tier's cache."),
    "eval": ("scheduler.cli.eval", "Evaluate predictor accuracy on measured data."),
    "train": ("scheduler.cli.train", "Train the learned predictor tier and write an artifact."),
    "simulate": ("scheduler.cli.simulate", "Run placement policies in the simulator."),
    "profile": ("scheduler.cli.profile", "Run jobs on the local GPU and record measurements."),
    "submit": ("scheduler.cli.service", "Submit a job file to the scheduler."),
    "status": ("scheduler.cli.service", "Show job status."),
    "cancel": ("scheduler.cli.service", "Cancel a job."),
    "logs": ("scheduler.cli.service", "Show a job's captured stdout/stderr."),
    "queue": ("scheduler.cli.jobs", "List jobs like squeue (state, where, elapsed, reason)."),
    "acct": ("scheduler.cli.jobs", "Accounting like sacct: cost, GPU-hours, predicted vs actual."),
    "hold": ("scheduler.cli.jobs", "Keep pending jobs from being placed."),
    "release": ("scheduler.cli.jobs", "Release held jobs."),
    "requeue": ("scheduler.cli.jobs", "Put jobs back to pending as a new attempt."),
    "log": ("scheduler.cli.ops", "Show the placement log."),
    "explain": ("scheduler.cli.ops", "Explain why a job went where it went."),
    "pool": ("scheduler.cli.ops", "Show pool occupancy."),
    "serve": ("scheduler.cli.serve", "Scale and inspect serving deployments (task: serve)."),
    "node": ("scheduler.cli.node", "Cordon, drain or uncordon a node."),
    "scheduler": ("scheduler.cli.service", "Run the scheduler service (leader election)."),
    "worker": ("scheduler.cli.worker", "Run a worker for one node."),
    "demo": ("scheduler.cli.demo.command", "Run the end-to-end demo on an embedded Redis."),
    "dashboard": ("scheduler.cli.dashboard", "Serve the live read-only web dashboard."),
    "doctor": ("scheduler.cli.doctor", "Check the Redis deployment: topology, AOF, ACL, queues."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, help_text = entry
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return _unavailable(cmd_name, help_text)
            raise
        cmd: Any = getattr(module, f"{cmd_name}_command", None) or getattr(module, "command", None)
        if cmd is None:
            return _unavailable(cmd_name, help_text)
        return cmd  # type: ignore[no-any-return]


def _unavailable(name: str, help_text: str) -> click.Command:
    @click.command(name=name, help=help_text + " (not available in this build)")
    def _cmd() -> None:
        raise click.ClickException(f"`snugfit {name}` is not available in this build")

    return _cmd


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="snugfit")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Read option defaults from this TOML file only (default: $SNUGFIT_CONFIG, else "
    "./snugfit.toml over $SNUGFIT_HOME/snugfit.toml).",
)
@click.pass_context
def cli(ctx: click.Context, config_file: str | None) -> None:
    """snugfit: predict GPU memory and runtime, then place jobs on the cheapest slot that fits.

    Option values come from the command line, then the option's environment variable, then
    snugfit.toml (see --config), then the built-in default.
    """
    from scheduler.cli._config import ConfigDefaults, config_files, datasets_from, load

    files = config_files(config_file)
    if not files:
        return
    cfg = load(files, list(_COMMANDS))
    datasets = datasets_from(cfg)
    if datasets is not None and not os.environ.get("SNUGFIT_DATASETS"):
        # The environment variable wins; the file's value reaches child processes too.
        os.environ["SNUGFIT_DATASETS"] = str(datasets)
    ctx.default_map = ConfigDefaults(cfg, cli, ctx)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="snugfit")
