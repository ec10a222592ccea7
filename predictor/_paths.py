"""Where the shipped data lives.

``datasets/`` sits at the repository root (it is data, not a package, so it cannot shadow
Hugging Face ``datasets``). ``SNUGFIT_DATASETS`` overrides it for installs outside a checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["datasets_dir", "shared_dir"]


def datasets_dir() -> Path:
    env = os.environ.get("SNUGFIT_DATASETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "datasets"


def shared_dir() -> Path:
    """The read-only ``../shared`` folder beside the checkout (validation data, traces)."""
    env = os.environ.get("SNUGFIT_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared"
