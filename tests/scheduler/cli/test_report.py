"""The HTML report is self-contained and its charts render in a real (headless) browser."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from scheduler.cli.report import JobRow, ReportData, render_report, rows_from_records, write_report
from tests.browser import chromium


def _rows() -> list[JobRow]:
    return [
        JobRow("a", "H100-80GB", "whole", "h100-0", (0, 1), 0.0, 3600.0, 60.0, 50.0, 48.0, 5.9),
        JobRow("b", "A100-80GB", "mig", "mig-0", (2,), 600.0, 4000.0, 9.5, 8.0, 7.5, 0.4),
        JobRow("c", "A100-80GB", "mig", "mig-0", (2,), 900.0, 2000.0, 19.0, 15.0, None, 0.3),
        JobRow("d", "H100-80GB", "shared", "sh-0", (3,), 100.0, 7200.0, 30.0, 25.0, 26.0, 1.2),
    ]


def _data() -> ReportData:
    return ReportData(
        title="demo <run>",
        rows=_rows(),
        gpu_labels={0: "h100-0/0", 1: "h100-0/1", 2: "mig-0/2", 3: "sh-0/3"},
        cost_by_policy={"snugfit (live)": 8.1, "requested (simulated)": 20.5},
        summary=[("snugfit", {"cost_usd": 8.1, "oom_kills": 0}), ("requested", {"cost_usd": 20.5})],
        notes=["baseline from the simulator, same workload and seed"],
    )


def test_report_is_self_contained_with_three_charts() -> None:
    html = render_report(_data())
    assert html.startswith("<!DOCTYPE html>")
    assert "demo &lt;run&gt;" in html  # escaped
    assert len(re.findall(r"<svg class=\"chart (gantt|vram|cost)\"", html)) == 3
    assert html.count('class="job"') == 5  # a on 2 GPUs + b + c + d
    assert html.count('class="reserved"') == 4 and html.count('class="used"') == 3
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    assert "$8" in html and "$20" in html


def test_overlapping_slices_on_one_gpu_get_separate_lanes() -> None:
    html = render_report(_data())
    ys = {float(y) for y in re.findall(r'class="job" x="[^"]+" y="([^"]+)"', html)}
    assert len(ys) == 5  # b and c overlap on GPU 2: two lanes, distinct y


def test_rows_from_records_uses_placement_outcome_and_time_scale() -> None:
    rec = {
        "id": "j",
        "state": "succeeded",
        "started_at": 110.0,
        "finished_at": 112.0,
        "placement": {"gpu_type": "H100-80GB", "kind": "whole", "node": "h", "gpu_indices": [4],
                      "reserved_gib": 22.0, "cost_usd": 1.5, "label": "H100-80GB x1"},
        "outcome": {"peak_vram_gib": 17.0},
        "decision": {"chosen": 0, "options": [{"vram_gib": 18.0}]},
    }  # fmt: skip
    rows = rows_from_records([rec, {"id": "never-started", "state": "pending"}], t0=100.0,
                             time_scale=60.0)  # fmt: skip
    assert len(rows) == 1
    r = rows[0]
    assert (r.start_s, r.end_s, r.gpus) == (600.0, 720.0, (4,))
    assert (r.reserved_gib, r.actual_gib, r.predicted_gib) == (22.0, 17.0, 18.0)


def test_empty_report_still_renders() -> None:
    html = render_report(ReportData("empty", [], {}, {}))
    assert html.count('class="chart empty"') == 3


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    path = write_report(tmp_path / "report.html", _data())
    browser = chromium()
    assert browser is not None
    base = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
    ]  # fmt: skip
    dom = subprocess.run(
        [*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The DOM the browser built (not the file): three charts with their marks.
    assert len(re.findall(r'<svg class="chart (gantt|vram|cost)"', dom.stdout)) == 3
    assert dom.stdout.count('class="job"') == 5
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,1400", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert _distinct_colours(shot.read_bytes()) > 8  # coloured bars, not a blank page


def _distinct_colours(png: bytes) -> int:
    """Distinct RGB colours in a PNG (8-bit RGB/RGBA, non-interlaced: what Chromium writes)."""
    import struct
    import zlib

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        data = png[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, _, ctype = struct.unpack(">IIBB", data[:10])
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        if y % 7 == 0:
            for x in range(0, stride, bpp * 5):
                colours.add(bytes(line[x : x + 3]))
        prev = line
    return len(colours)
