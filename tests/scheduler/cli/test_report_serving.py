"""The report's serving section: a frontier per GPU type and $ per 1M tokens per GPU type."""

from __future__ import annotations

import re

import pytest

from predictor.gpus import GPU_NAMES
from predictor.serving import plan, plan_frontiers
from predictor.spec import parse_spec
from scheduler.cli.report import ReportData, render_report
from scheduler.cli.report_serving import DEMO_DEPLOYMENTS, per_gpu_type, serving_html


@pytest.fixture(scope="module")
def plans() -> list:  # type: ignore[type-arg]
    return [plan(parse_spec({"id": k, **v})) for k, v in DEMO_DEPLOYMENTS.items()]


def test_one_8b_and_one_70b_deployment_are_charted() -> None:
    names = {parse_spec(v).arch.params_b for v in DEMO_DEPLOYMENTS.values()}
    assert len(DEMO_DEPLOYMENTS) == 2 and min(names) < 10 < 60 < max(names)


def test_each_plan_gets_a_curve_and_a_price_bar_per_gpu_type(plans) -> None:  # type: ignore[no-untyped-def]
    page = serving_html(plans)
    assert "not measured" in page and "Predicted" in page
    frontiers = re.findall(r'<svg class="chart frontier".*?</svg>', page, re.S)
    bars = re.findall(r'<svg class="chart usd".*?</svg>', page, re.S)
    assert len(frontiers) == len(bars) == len(plans)
    for p, svg, bar in zip(plans, frontiers, bars, strict=True):
        curves = per_gpu_type(plan_frontiers(p))
        assert set(curves) <= set(GPU_NAMES) and len(curves) >= 3
        assert svg.count("<polyline") == len(curves) and bar.count('class="bar"') == len(curves)
        assert "SLO TPOT" in svg
        cheapest = min(c["usd_per_million_tokens"] for c in curves.values())
        assert p.best is not None and p.best.usd_per_million_tokens == pytest.approx(
            cheapest, abs=1e-4
        )
        for c in curves.values():
            xs = [pt["tok_s_per_gpu"] for pt in c["points"]]
            assert xs == sorted(xs)  # more load, more tokens/s ...
            assert c["points"][-1]["tpot_p95_s"] > c["points"][0]["tpot_p95_s"]  # ... slower


def test_report_carries_the_section_only_when_given(plans) -> None:  # type: ignore[no-untyped-def]
    bare = render_report(ReportData("r", [], {}, {}))
    assert "Serving by SLO" not in bare
    full = render_report(ReportData("r", [], {}, {}, extra={"serving_html": serving_html(plans)}))
    assert "Serving by SLO" in full and full.rstrip().endswith("</html>")
