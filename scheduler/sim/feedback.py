"""Feedback from measured runs in the simulator: the same :class:`RequestHistory` the live leader
keeps, fed the same way (finished runs as ratios, OOMs as censored floors at their limit).
"""

from __future__ import annotations

from scheduler.core.history import RequestHistory

__all__ = ["FeedbackHistory"]

#: The simulator's name for the shared history (kept for callers of ``scheduler.sim``).
FeedbackHistory = RequestHistory
