"""Where the shipped data lives.

``datasets/`` sits at the repository root (it is data, not a package, so it cannot shadow
Hugging Face ``datasets``). It is found, first match wins:

1. ``$SNUGFIT_DATASETS`` (any install; the CLI also sets it from a ``datasets`` key in
   ``snugfit.toml`` when the variable is unset);
2. the checkout this code runs from (``<repo>/datasets``, an editable install or ``PYTHONPATH``);
3. the installed copy: ``pip install .`` puts it under ``<prefix>/share/snugfit/datasets``
   (``[tool.setuptools.data-files]`` in ``pyproject.toml``), or the user scheme's prefix for
   ``pip install --user``.

Never the working directory: a command works the same from any folder.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

__all__ = ["datasets_dir", "shared_dir"]

# A file every datasets folder has; site-packages/datasets is Hugging Face's package, not ours.
_MARKER = Path("models") / "catalogue.json"
_INSTALLED = Path("share") / "snugfit" / "datasets"


def _candidates() -> list[Path]:
    out = [Path(__file__).resolve().parent.parent / "datasets"]
    for scheme in (None, f"{os.name}_user"):
        try:
            data = sysconfig.get_path("data", scheme) if scheme else sysconfig.get_path("data")
        except KeyError:
            continue
        if data:
            out.append(Path(data) / _INSTALLED)
    return out


def datasets_dir() -> Path:
    env = os.environ.get("SNUGFIT_DATASETS")
    if env:
        return Path(env)
    candidates = _candidates()
    for c in candidates:
        if (c / _MARKER).is_file():
            return c
    # Nothing found: the checkout path, so the error that follows names a concrete place.
    return candidates[0]


def shared_dir() -> Path:
    """The read-only ``../shared`` folder beside the checkout (validation data, traces)."""
    env = os.environ.get("SNUGFIT_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared"
