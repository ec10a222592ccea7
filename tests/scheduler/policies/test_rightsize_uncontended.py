"""rightsize's shortcuts: when every job of a short queue starts on its cheapest option of the
tick's starting state, the policy skips the repack and the local search; when the head of a
long queue all starts, only the rest is walked again. Decisions and the state left must equal
the full search's, contended ticks included."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.decision import Decision
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.core.synthetic import synthetic_pool
from scheduler.policies.rightsize import RightSizePolicy

SPEED = np.array([1.0, 0.9, 0.45, 0.4, 0.22])


class _Full(RightSizePolicy):
    """rightsize that always runs the repack and the local search, and walks the whole
    queue again after a head that all started."""

    @staticmethod
    def _uncontended(*args: object) -> bool:
        return False

    def _continue(self, tick, head, first, state):  # type: ignore[no-untyped-def]
        return self._greedy(tick, tick.pending, state, backfill=self.backfill)


class _Counting(RightSizePolicy):
    hits = 0

    def _uncontended(self, *args: object) -> bool:  # type: ignore[override]
        got = RightSizePolicy._uncontended(*args)  # type: ignore[arg-type]
        _Counting.hits += int(got)
        return got


def _jobs(
    rng: np.random.Generator, n: int, tag: str, host_asks: bool = False
) -> list[PlacementRequest]:
    out = []
    for k in range(n):
        upper = float(min(rng.lognormal(2.4, 1.0), 170.0))
        rt = float(rng.lognormal(7.5, 1.0)) * SPEED
        out.append(
            PlacementRequest(
                f"{tag}{k}",
                [upper * 0.9] * 5,
                [upper] * 5,
                rt,
                rt * 1.2,
                n_gpus=int(rng.choice([1, 1, 1, 1, 2, 4, 8])),
                submit_time_s=float(k),
                # Some jobs ask more CPUs than their share: the per-node host check applies.
                cpus=float(rng.choice([8.0, 48.0])) if host_asks and rng.random() < 0.2 else None,
            )
        )
    return out


def _view(decisions: list[Decision]) -> list[tuple[object, ...]]:
    out = []
    for d in decisions:
        o = d.chosen_option
        out.append(
            (d.job_id, d.state, d.chosen, d.reason, d.runner_up, None if o is None else o.to_dict())
        )
    return out


def _same_summary(a: PoolState, b: PoolState) -> bool:
    sa, sb = a.summary(), b.summary()
    return all(np.array_equal(getattr(sa, f), getattr(sb, f)) for f in sa.__dataclass_fields__)


def _prefill(state: PoolState, rng: np.random.Generator, n: int) -> None:
    for d in RightSizePolicy().schedule(_jobs(rng, n, "pre"), state, 0.0):
        assert d.state in ("placed", "pending", "rejected")


def _compare(seed: int, head: int) -> None:
    rng = np.random.default_rng(seed)
    # Small queues on a large pool (mostly uncontended), then a smaller, fuller pool.
    pool = synthetic_pool(512 if seed % 2 else 64, seed=seed)
    base = pool.state()
    _prefill(base, rng, int(rng.integers(0, 60)))
    for tick in range(6):
        n = int(rng.integers(2, 12 if seed % 2 else 40))
        queue = _jobs(rng, n, f"t{tick}-", host_asks=seed % 3 == 0)
        fast_state, full_state = base.copy(), base.copy()
        fast = _Counting(repack_max_jobs=head).schedule(queue, fast_state, 10.0 * tick)
        full = _Full(repack_max_jobs=head).schedule(queue, full_state, 10.0 * tick)
        assert _view(fast) == _view(full)
        assert list(fast_state.allocations().items()) == list(full_state.allocations().items())
        fast_state.assert_consistent()
        assert _same_summary(fast_state, full_state)
        base = full_state


@pytest.mark.parametrize("head", [256, 6])
@pytest.mark.parametrize("seed", range(12))
def test_shortcut_ticks_decide_what_the_full_search_decides(seed: int, head: int) -> None:
    _compare(seed, head)


def test_the_uncontended_shortcut_is_taken() -> None:
    _Counting.hits = 0
    for seed in range(12):
        _compare(seed, 256)
    assert _Counting.hits >= 20  # of 72 ticks
