"""The environment a job runs with: its own, never the worker's.

A job gets a minimal ``PATH``, ``HOME`` and ``LANG``, then the spec's ``env`` mapping, then
the variables the worker owns (the devices it may see, its MPS limits, its identity), which the
spec cannot override. Nothing else of the worker's environment reaches it: the worker's
``SNUGFIT_REDIS_URL`` (with its password), cloud credentials, virtualenv paths stay with the
worker, as with Slurm's ``--export=NONE`` or a Kubernetes pod.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DEFAULT_JOB_PATH", "job_environment"]

#: PATH for a job that sets none: the system's binaries, not the worker's virtualenv.
DEFAULT_JOB_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_environment(
    spec_env: Mapping[str, str] | None,
    worker_vars: Mapping[str, str],
    *,
    home: str | None = None,
) -> dict[str, str]:
    """The whole environment of one job: base, then the spec's ``env``, then ``worker_vars``."""
    env = {
        "PATH": DEFAULT_JOB_PATH,
        "HOME": home if home is not None else os.environ.get("HOME", "/"),
        "LANG": "C.UTF-8",
    }
    env.update(spec_env or {})
    env.update(worker_vars)
    return env
