"""Rendering of decisions, breakdowns, pending reasons, log lines and the pool view."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from scheduler.cli import render
from scheduler.core.decision import Decision
from scheduler.core.pool import load_pool
from tests.placement import option as _opt

REPO = Path(__file__).resolve().parents[3]


def _text(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _placed() -> Decision:
    opts = [
        _opt("H100-80GB", 2.99, reason="costs $1.70 more than chosen"),
        _opt("A100-40GB", 1.29, capacity_gib=40.0),
        _opt("B200-180GB", 5.49, fits=False),
        _opt("A100-40GB", 0.2, fits=False, fits_empty=False, reason="A100-40GB: needs 90 GiB"),
    ]
    return Decision("j1", "rightsize", "placed", opts, chosen=1, reason="cheapest", runner_up=0)


def test_decision_table_marks_the_chosen_row_first_and_says_why_others_lost() -> None:
    out = _text(render.decision_table(_placed()))
    lines = [ln for ln in out.splitlines() if "GB" in ln and "│" in ln]
    assert "✔" in lines[0] and "CHOSEN" in lines[0] and "A100-40GB x1" in lines[0]
    assert "FITS (runner-up)" in lines[1] and "costs $1.70 more" in lines[1]
    assert "insufficient free B200-180GB: 1 more needed" in out
    assert lines[-1].count("needs 90 GiB") == 1  # fits nowhere: last
    assert "$1.29" in out and "1h00m" in out and "20.0/40.0" in out


def test_decision_table_caps_rows() -> None:
    d = Decision("j", "p", "pending", [_opt("H100-80GB", float(i)) for i in range(50)])
    out = _text(render.decision_table(d, max_rows=5))
    assert "45 more options" in out


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("waiting: insufficient free A100-80GB: 2 more needed", "Resources"),
        ("waiting: held back by the policy although an option fits now", "Priority"),
        ("waiting: pinned to H200-141GB", "ReqNodeNotAvail"),
    ],
)
def test_pending_reason_uses_slurm_codes(reason: str, code: str) -> None:
    d = Decision("j", "rightsize", "pending", [_opt("A100-80GB", 3.0, fits=False)], reason=reason)
    text = render.pending_reason(d)
    assert text.startswith(f"Reason={code}: ")
    assert "waiting:" not in text
    assert "cheapest option A100-80GB x1 $3.00; 1 option fit an empty pool" in text


def test_pending_reason_without_decision_and_rejected() -> None:
    assert "not yet considered" in render.pending_reason(None, "pending")
    d = Decision("j", "rightsize", "rejected", [], reason="fits nowhere even on an empty pool: x")
    assert render.pending_reason(d).startswith("Reason=PartitionConfig: fits nowhere")


def test_breakdown_table_lists_every_component_and_total() -> None:
    bd = {"weights": 15.0, "gradients": 15.0, "optimizer": 30.0, "activations": 0.8,
          "kv_cache": 0.0, "logits": 0.2, "overhead": 0.2}  # fmt: skip
    out = _text(render.breakdown_table(bd, capacity_gib=80.0))
    for k in render.BREAKDOWN_ORDER:
        assert k in out
    assert "61.20" in out and "49%" in out and "of 80.0 GiB slot" in out


def test_predicted_vs_actual_ratios() -> None:
    out = _text(
        render.predicted_vs_actual_table(
            _opt("H100-80GB", 1.0), {"peak_vram_gib": 14.0, "runtime_s": 1800.0, "simulated": True}
        )
    )
    assert "0.80x" in out and "0.50x" in out and "simulated run" in out


def test_explain_for_unrun_job_has_no_actuals() -> None:
    job = {"id": "j1", "state": "placed", "attempt": 1, "spec": {"model": "gpt2", "task": "lora"}}
    preds = {"A100-40GB": {"breakdown_gib": {"weights": 1.0, "overhead": 0.5}, "method": "m"}}
    out = _text(render.explain(job, _placed(), predictions=preds))
    assert "model=gpt2" in out and "breakdown on A100-40GB" in out
    assert "predicted vs actual" not in out and "Reason=" not in out


def test_explain_survives_a_spec_that_is_not_an_object() -> None:
    # Anyone who can write to Redis can store any JSON there; explain shows what it can.
    for spec in (["not", "a", "dict"], "text", 3, None):
        out = _text(render.explain({"id": "j1", "state": "placed", "spec": spec}, _placed()))
        assert "job j1" in out and "model=" not in out


def test_event_line_is_one_line_with_option_cost_runner_up() -> None:
    d = _placed()
    ev = {"ts": 0.0, "event": "placed", "job_id": "j1", "attempt": 2, "node": "n0",
          "option": d.options[1].to_dict(), "cost_usd": 1.29,
          "runner_up": d.options[0].to_dict(), "reason": "cheapest", "policy": "rightsize",
          "outcome": None, "simulated": True}  # fmt: skip
    line = render.event_line(ev)
    assert "\n" not in line
    assert line.startswith("1970-01-01T00:00:00.000Z  placed")
    for part in ("j1#2", "-> A100-40GB x1 on n0[0]", "cost $1.29", "runner-up H100-80GB x1 $2.99",
                 "policy=rightsize", "| cheapest", "[sim]"):  # fmt: skip
        assert part in line


def test_event_line_tolerates_minimal_and_invalid_events() -> None:
    assert "invalid" in render.event_line({"event": "invalid", "reason": "bad JSON"})
    line = render.event_line({"event": "oom", "job_id": "x", "outcome": {"oom": True}})
    assert "OOM" in line and line.startswith("-")


def test_fmt_duration() -> None:
    assert render.fmt_duration(5.25) == "5.2s"
    assert render.fmt_duration(725) == "12m05s"
    assert render.fmt_duration(3 * 3600 + 7 * 60) == "3h07m"
    assert render.fmt_duration(52 * 3600) == "2d04h"
    assert render.fmt_duration(None) == "-"


def test_pool_view_shows_jobs_mig_layout_shares_and_free_by_type() -> None:
    pool = load_pool(REPO / "datasets/pools/small.toml")
    state = pool.state()
    mig_gpu = next(n for n in pool.nodes if n.mode == "mig").first_gpu
    layout = next(n for n in pool.nodes if n.mode == "mig").mig_layout
    assert layout is not None
    profile, start = layout[0][0]
    mig = _opt("A100-80GB", 0.5, kind="mig", mig_profile=profile, mig_start=start,
               gpu_indices=(mig_gpu,), node="a100-80-mig", capacity_gib=40.0)  # fmt: skip
    shared_gpu = next(n for n in pool.nodes if n.mode == "shared").first_gpu
    sh = _opt("H200-141GB", 0.5, kind="shared", gpu_indices=(shared_gpu,), node="h200-shared")
    allocs = {}
    for jid, o in (("mig-job", mig), ("shared-job", sh)):
        state.allocate(o, jid)
        a = state._allocs[jid]
        allocs[jid] = {
            "gpus": list(a.gpus),
            "reserved_mib": a.reserved_mib,
            "used_mib": a.used_mib,
            "mig_mask": a.mig_mask,
            "option": o.to_dict(),
        }
    allocs["corrupt"] = {"gpus": [0], "option": {"kind": "bogus"}}
    out = _text(render.pool_view(pool, allocs), width=220)
    assert f"[{profile}@{start} mig-job]" in out
    assert "shared-job (20.0 GiB)" in out and "[1/3 shares]" in out
    assert "free capacity by type" in out
    free = render.free_by_type(pool, allocs)
    assert free["H200-141GB"]["idle_gpus"] == 1
    assert free["A100-40GB"]["idle_gpus"] == 4  # the corrupt record holds nothing


def test_comparison_table_side_by_side() -> None:
    a = {"cost_usd": 1234.5, "smallest_fit_rate": 0.81, "queue_delay_p95_s": 95.0}
    b = {"cost_usd": 2500.0, "smallest_fit_rate": 0.10, "queue_delay_p95_s": None}
    out = _text(render.comparison_table([("snugfit", a), ("requested", b)]))
    assert "$1,234" in out and "$2,500" in out and "81%" in out and "1m35s" in out


def test_event_line_prints_a_malformed_event_instead_of_raising() -> None:
    from scheduler.cli.render import event_line

    line = event_line({"event": "finished", "job_id": "j1", "attempt": "one", "outcome": 7})
    assert line.startswith("finished") and "j1" in line and "malformed" in line
    assert "malformed" not in event_line({"ts": 1.0, "event": "placed", "job_id": "j2"})
