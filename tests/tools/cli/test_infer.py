"""``ursa device run --infer``'s serving loop: rows in, classes out, bad rows named."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest

from ursa.tools.cli.infer import ModelWatch, parse_row, serve_lines

MODEL = {"input_dim": 4, "num_classes": 3, "hidden_sizes": [5]}


def test_rows_parse_from_commas_or_spaces() -> None:
    row = parse_row("1, 2 3.5\n")
    assert row is not None
    np.testing.assert_array_equal(row, np.array([1, 2, 3.5], np.float32))
    assert parse_row("   \n") is None
    with pytest.raises(ValueError):
        parse_row("1, x")
    with pytest.raises(ValueError):
        parse_row("1, inf")


def test_serving_answers_each_row_and_names_bad_lines(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from ursa.edge_sdk.inference import load
    from ursa.models.onnx_export import export_arrays_to_onnx
    from ursa.models.registry import initial_arrays

    path = tmp_path / "model.onnx"
    path.write_bytes(
        export_arrays_to_onnx("mlp", MODEL, initial_arrays("mlp", MODEL, seed=1))
    )
    lines = ["0 0 0 1\n", "1,2\n", "nope\n", "\n", "1 1 1 1\n"]
    out, err = io.StringIO(), io.StringIO()
    answered = serve_lines(
        lines,
        ModelWatch(path),
        out,
        err,
        ready=threading.Event(),
        stop=threading.Event(),
    )
    assert answered == 2
    expected = load(path).predict(np.array([[0, 0, 0, 1], [1, 1, 1, 1]], np.float32))
    assert out.getvalue().split() == [str(int(v)) for v in expected]
    assert err.getvalue().startswith("line 2: ")
    assert "line 3: " in err.getvalue()


def test_without_a_model_serving_stops_with_the_device(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    out = io.StringIO()
    answered = serve_lines(
        ["1 2 3 4\n"],
        ModelWatch(tmp_path / "absent.onnx"),
        out,
        io.StringIO(),
        ready=threading.Event(),
        stop=stop,
    )
    assert answered == 0 and out.getvalue() == ""
