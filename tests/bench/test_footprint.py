from __future__ import annotations

import json

import pytest

from ursa.bench.footprint import IMPORT_PROBES, Probe, run, run_probe


def test_a_probe_reports_its_own_peak_rss_not_the_parents() -> None:
    result = run_probe(Probe("bare", "pass"))
    assert result.skipped is None
    assert result.peak_rss_mib is not None
    # a bare interpreter, not this pytest process (which has imported far more)
    assert 1 < result.peak_rss_mib < 64


def test_selection_only_probe_checks_that_torch_stays_out() -> None:
    result = run_probe(IMPORT_PROBES[1])
    assert result.skipped is None and result.seconds is not None


def test_a_probe_whose_extra_is_missing_is_skipped() -> None:
    probe = Probe("needs nothing real", "pass", needs=("no-such-distribution-xyz",))
    result = run_probe(probe)
    assert result.skipped == "no-such-distribution-xyz not installed"
    assert result.seconds is None


def test_a_failing_probe_raises_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_probe(Probe("broken", "1 / 0"))


def test_json_output_lists_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(as_json=True, repeats=1) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["label"] for p in data["probes"]] == [p.label for p in IMPORT_PROBES]
    assert data["environment"]["python"]


@pytest.mark.slow
def test_steps_train_a_round_and_run_its_onnx_export_without_torch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    assert run(as_json=True, repeats=1, steps=True) == 0
    probes = json.loads(capsys.readouterr().out)["probes"]
    train, infer = probes[-2], probes[-1]
    assert train["skipped"] is None and train["step_seconds"] is not None
    assert infer["skipped"] is None  # the probe asserts torch stayed out


def test_a_crashed_probe_is_a_failed_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ursa.bench.footprint as footprint

    crash = Probe("crash", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(footprint, "IMPORT_PROBES", (IMPORT_PROBES[0], crash))
    assert footprint.run(repeats=1) == 1
    out = capsys.readouterr().out
    assert "FAILED: the interpreter died (signal 11)" in out
    assert "bare interpreter (pass)" in out  # the other probes still print
