"""`ursa.edge_sdk.inference`: load the final ONNX model, predict, never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ursa.edge_sdk import inference

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

MODEL = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [6]}


@pytest.fixture
def final_dir(tmp_path: Path) -> Path:
    """A device's ``final`` folder with a small MLP's ONNX export."""
    from ursa.models.onnx_export import export_arrays_to_onnx
    from ursa.models.registry import initial_arrays

    folder = tmp_path / "final"
    folder.mkdir()
    arrays = initial_arrays("mlp", MODEL, seed=3)
    (folder / "model.onnx").write_bytes(export_arrays_to_onnx("mlp", MODEL, arrays))
    return folder


def test_load_and_predict_without_importing_torch(final_dir: Path) -> None:
    code = (
        "import sys, numpy as np; from ursa.edge_sdk import inference; "
        f"m = inference.load({str(final_dir)!r}); "
        "p = m.predict(np.ones((5, 8), np.float32)); "
        "assert p.shape == (5,) and p.dtype == np.int64 and set(p) <= {0, 1, 2}; "
        "assert m.input_shape == (8,); "
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_predictions_match_torch(final_dir: Path) -> None:
    import torch

    from ursa.models.registry import build_model, initial_arrays, load_arrays

    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    net = build_model("mlp", MODEL, seed=0)
    load_arrays(net, initial_arrays("mlp", MODEL, seed=3))
    net.eval()
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy().argmax(axis=1)
    model = inference.load(final_dir / "model.onnx")
    np.testing.assert_array_equal(model.predict(x), expected)
    np.testing.assert_allclose(model.predict_proba(x).sum(axis=1), 1.0, rtol=1e-5)


def test_a_missing_model_or_a_misfit_row_is_a_typed_error(
    final_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(inference.InferenceError, match="cannot read"):
        inference.load(tmp_path / "nowhere")
    model = inference.load(final_dir)
    with pytest.raises(inference.InferenceError, match="does not fit"):
        model.predict(np.ones((2, 5), np.float32))
