"""The OOM retry rule: grow, move past the slot the job had whole, fail when nothing is bigger."""

from __future__ import annotations

import math

from scheduler.core.escalation import escalate_after_oom, largest_slot_gib
from scheduler.core.pool import Pool


def _esc(kind: str, reserved: float, cap: float, largest: float = math.inf):  # type: ignore[no-untyped-def]
    return escalate_after_oom(
        label="X", kind=kind, reserved_gib=reserved, capacity_gib=cap, largest_gib=largest
    )


def test_whole_gpu_oom_moves_past_its_capacity() -> None:
    e = _esc("whole", 30.0, 39.5)
    assert e.possible and e.bigger_slot and e.reserved_gib > 39.5
    assert "bigger GPU type" in e.reason


def test_mig_slice_oom_moves_to_a_larger_slice_or_whole_gpu() -> None:
    e = _esc("mig", 9.0, 9.75)
    assert e.bigger_slot and e.reserved_gib > 9.75 and "larger slice or a whole GPU" in e.reason


def test_shared_oom_grows_within_the_gpu_while_it_fits() -> None:
    e = _esc("shared", 20.0, 79.6)  # the shared GPU holds the grown reservation
    assert not e.bigger_slot and math.isclose(e.reserved_gib, 25.0)
    e2 = _esc("shared", 70.0, 79.6)  # 1.25 x 70 no longer fits the GPU it shared
    assert e2.bigger_slot and e2.reserved_gib > 79.6


def test_nothing_bigger_fails_with_the_reason() -> None:
    e = _esc("whole", 150.0, 178.9, largest=178.9)
    assert not e.possible and "nothing bigger exists" in e.reason


def test_largest_slot_respects_a_pinned_type() -> None:
    pool = Pool.from_dict(
        {
            "name": "p",
            "nodes": [
                {"name": "a", "gpu": "A100-40GB", "count": 1},
                {"name": "b", "gpu": "B200-180GB", "count": 1},
            ],
        }
    )
    assert largest_slot_gib(pool) > 170
    assert 39 < largest_slot_gib(pool, "A100-40GB") < 41
    assert largest_slot_gib(pool, "H100-80GB") == 0.0
