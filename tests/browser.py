"""The headless browser the rendering tests drive, when the machine has one."""

from __future__ import annotations

import shutil


def chromium() -> str | None:
    """Path of a Chromium-family binary on ``PATH``, or ``None`` (those tests then skip)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None
