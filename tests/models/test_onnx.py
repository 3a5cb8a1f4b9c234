from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ursa.models.inference import InferenceError, OnnxClassifier
from ursa.models.onnx_export import export_arrays_to_onnx, export_onnx
from ursa.models.registry import build_model, initial_arrays

torch.set_num_threads(1)
CASES = [
    ("mlp", {"input_dim": 64, "num_classes": 10}, (64,)),
    ("cnn", {"input_shape": [1, 8, 8], "num_classes": 10}, (1, 8, 8)),
]


@pytest.mark.parametrize(("name", "config", "shape"), CASES)
def test_onnx_predictions_equal_torch_predictions(
    name: str, config: dict[str, object], shape: tuple[int, ...]
) -> None:
    model = build_model(name, config, seed=0).eval()
    x = np.random.default_rng(0).normal(size=(64, *shape)).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(x))

    classifier = OnnxClassifier(export_onnx(model, shape))

    assert classifier.input_shape == shape
    np.testing.assert_array_equal(classifier.predict(x), logits.argmax(1).numpy())
    np.testing.assert_allclose(
        classifier.predict_proba(x), torch.softmax(logits, 1).numpy(), atol=1e-5
    )


def test_export_leaves_training_mode_unchanged() -> None:
    model = build_model("cnn", {"input_shape": [1, 8, 8], "num_classes": 10}).train()

    export_onnx(model, (1, 8, 8))

    assert model.training


def test_export_from_arrays_and_flattened_input() -> None:
    config = {"input_shape": [1, 8, 8], "num_classes": 10}
    arrays = initial_arrays("cnn", config, seed=3)
    classifier = OnnxClassifier(export_arrays_to_onnx("cnn", config, arrays))
    x = np.random.default_rng(1).normal(size=(5, 1, 8, 8)).astype(np.float32)

    proba = classifier.predict_proba(x)

    np.testing.assert_array_equal(classifier.predict(x.reshape(5, 64)), proba.argmax(1))
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-5)
    assert classifier.predict(x[0]).shape == (1,)


def test_exports_from_several_threads_all_succeed() -> None:
    # torch's exporter keeps global state: unserialised, most of these fail
    config = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}
    arrays = initial_arrays("mlp", config, seed=0)
    results: list[bytes | Exception] = []

    def export() -> None:
        try:
            results.append(export_arrays_to_onnx("mlp", config, arrays))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=export) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 6
    assert all(isinstance(r, bytes) for r in results), results
    assert len(set(results)) == 1


def test_bad_input_and_bad_model_raise() -> None:
    model = build_model("mlp", {"input_dim": 64, "num_classes": 10})
    classifier = OnnxClassifier(export_onnx(model, (64,)))

    with pytest.raises(InferenceError, match="does not fit"):
        classifier.predict(np.zeros((2, 63), np.float32))
    with pytest.raises(InferenceError, match="cannot load"):
        OnnxClassifier(b"not an onnx model")


def test_inference_without_torch(tmp_path: Path) -> None:
    model = build_model("mlp", {"input_dim": 64, "num_classes": 10}, seed=0).eval()
    x = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float32)
    (tmp_path / "m.onnx").write_bytes(export_onnx(model, (64,)))
    np.save(tmp_path / "x.npy", x)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).argmax(1).numpy()
    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from ursa.models.inference import OnnxClassifier\n"
        f"d = Path({str(tmp_path)!r})\n"
        "c = OnnxClassifier((d / 'm.onnx').read_bytes())\n"
        "np.save(d / 'y.npy', c.predict(np.load(d / 'x.npy')))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
