"""zoo.length_cost runs end to end: per mixer and length a timed forward+backward, its planned memory, model FLOPs and
roofline; cases that would not fit are recorded with the figure; the plot has each mixer's roofline dashed."""

import json

import pytest

from zoo import length_cost
from zoo.training import flops


def test_sweep_writes_time_memory_and_roofline_per_mixer_and_length(tmp_path):
    path = length_cost.main(["--mixers=softmax,linear", "--lengths=32,64", "--repeats=1", f"--out={tmp_path}"])
    payload = json.loads(path.read_text())
    rows = payload["results"]
    expected = [("softmax", 32), ("softmax", 64), ("linear", 32), ("linear", 64)]
    assert [(r["variant"], r["length"]) for r in rows] == expected
    assert payload["peak_tflops_per_device"] > 0 and payload["setting"]["causal"] is True
    for r in rows:
        model = length_cost.case_model(r["variant"], r["length"], d_model=256, heads=4, dtype="float32")
        assert r["model_flops"] == 3 * flops.mixer_flops(model, r["length"], causal=True)
        assert r["roofline_ms"] == pytest.approx(1e3 * r["model_flops"] / (payload["peak_tflops_per_device"] * 1e12))
        assert r["forward_backward_ms"] > 0 and r["memory_bytes"] > 0 and r["fraction_of_peak"] > 0
    svg = path.with_suffix(".svg").read_text()
    assert svg.count("<polyline") == 4 and svg.count("stroke-dasharray") == 2  # two mixers, each with its roofline


def test_a_case_that_does_not_fit_is_recorded_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(length_cost.memory, "device_memory_limit", lambda train: (1024, "test"))
    path = length_cost.main(["--mixers=relu", "--lengths=32", "--repeats=1", f"--out={tmp_path}"])
    (row,) = json.loads(path.read_text())["results"]
    assert row["skipped"].startswith("needs 0.00 GiB, more than 0.75 of the 0.00 GiB here")
    assert "forward_backward_ms" not in row


def test_dense_softmax_stops_at_its_length_limit(tmp_path):
    args = ["--mixers=softmax_dense", "--lengths=32,64", "--repeats=1", "--dense_max_length=32", f"--out={tmp_path}"]
    rows = json.loads(length_cost.main(args).read_text())["results"]
    assert "forward_backward_ms" in rows[0] and "not run past --dense_max_length=32" in rows[1]["skipped"]


def test_unknown_variant_is_a_usage_error_naming_it(capsys):
    with pytest.raises(SystemExit) as e:
        length_cost.parse_args(["--mixers=softmax,flash"])
    assert e.value.code == 2 and "unknown variant 'flash'; valid: softmax, softmax_dense" in capsys.readouterr().err
