from predictor.history import HistoryPredictor, cross_validate_history, fingerprint
from predictor.measurements import measurement_row, parse_measurement
from predictor.spec import parse_spec

SPEC = {"model": "llama-3.1-8b", "task": "lora", "seq_len": 1024, "command": ["python", "t.py"]}


def _m(i, peak, **kw):
    return parse_measurement(
        measurement_row(
            id=f"h{i}",
            origin="history",
            source="node",
            spec=SPEC,
            gpu="A100-80GB",
            peak_vram_gib=peak,
            date=f"2026-01-{i + 1:02d}",
            **kw,
        )
    )


def test_fingerprint_ignores_name_and_length_but_not_config():
    a = parse_spec({**SPEC, "id": "x", "steps": 10})
    assert fingerprint(a) == fingerprint(parse_spec({**SPEC, "id": "y", "steps": 99}))
    assert fingerprint(a) != fingerprint(parse_spec({**SPEC, "batch_size": 2}))
    assert fingerprint(a) != fingerprint(parse_spec({**SPEC, "command": ["python", "u.py"]}))


def test_fingerprint_ignores_who_ran_it_and_what_it_waited_for():
    # The client stamps every job with the OS user: one user's history must answer another's
    # run, and a simulated worker must draw the simulator's truth for it.
    a = parse_spec(SPEC)
    b = parse_spec({**SPEC, "user": "alice", "team": "nlp", "depends_on": ["prep-0"]})
    assert fingerprint(a) == fingerprint(b)


def test_recent_window_high_percentile():
    runs = [_m(i, 100.0 if i == 0 else 20.0 + i) for i in range(6)]
    h = HistoryPredictor(window=5).fit(runs)
    point, upper, n = h.lookup(parse_spec(SPEC), "A100-80GB", "peak_vram_gib")
    assert n == 5 and 24 < point <= 25 and upper == 25 * 1.05  # the old 100 GiB run aged out
    assert h.lookup(parse_spec(SPEC), "H100-80GB", "peak_vram_gib") is None


def test_simulated_and_oom_runs_do_not_count():
    runs = [_m(0, 20.0), _m(1, 90.0, oom=True), _m(2, 70.0, simulated=True)]
    h = HistoryPredictor().fit(runs)
    assert h.lookup(parse_spec(SPEC), "A100-80GB", "peak_vram_gib")[2] == 1


def test_leave_one_out_report():
    rep = cross_validate_history([_m(i, 20.0) for i in range(3)])
    assert rep.overall["peak_vram_gib"].mape == 0.0
