"""`ModuleTrainer`: an app's own torch module, BatchNorm buffers, loss and optimiser."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ursa.edge_sdk import ModelMismatchError, ModuleTrainer
from ursa.edge_sdk.training import TrainingError
from ursa.models.registry import load_arrays, state_dict_to_arrays
from ursa.models.weights import arrays_from_bytes, arrays_to_bytes


class BnNet(nn.Module):
    def __init__(self, hidden: int = 8, outputs: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Linear(hidden, outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def _data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)


def _global() -> dict[str, np.ndarray]:
    torch.manual_seed(1)
    return state_dict_to_arrays(BnNet())


def test_batchnorm_buffers_travel_float_ones_scaled_counters_not() -> None:
    x, y = _data()
    trainer = ModuleTrainer(BnNet(), x, y, train={"epochs": 2, "batch_size": 8})
    start = _global()
    trainer.check_arrays(start)

    delta = trainer.train_delta(1, start, delta_scale=0.5).delta

    assert list(delta) == list(start)
    counter = delta["net.1.num_batches_tracked"]
    assert counter.dtype == np.int64 and int(counter) == 2 * 5  # steps, unscaled
    assert not np.allclose(delta["net.1.running_mean"], 0.0)
    decoded = arrays_from_bytes(arrays_to_bytes(delta, dtype="float16"))
    assert decoded["net.1.num_batches_tracked"].dtype == np.int64
    np.testing.assert_allclose(
        decoded["net.1.running_var"], delta["net.1.running_var"], atol=1e-3
    )


def test_training_lowers_the_loss_and_the_round_seed_repeats_it() -> None:
    x, y = _data(120)
    start = _global()

    def trained() -> dict[str, np.ndarray]:
        trainer = ModuleTrainer(BnNet(), x, y, train={"epochs": 5, "lr": 0.1}, seed=3)
        delta = trainer.train_delta(2, start, delta_scale=1.0).delta
        return {k: start[k] + delta[k] for k in start}

    after = trained()
    judge = ModuleTrainer(BnNet(), x, y)
    assert judge.local_loss(after) < judge.local_loss(start)
    again = trained()
    for name in after:
        np.testing.assert_array_equal(after[name], again[name])


def test_the_apps_loss_and_optimiser_are_used() -> None:
    x, y = _data()
    calls = {"loss": 0, "optimizer": 0}

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["loss"] += 1
        return nn.functional.cross_entropy(outputs, targets, reduction="none")

    def optimizer(params: Any) -> torch.optim.Optimizer:
        calls["optimizer"] += 1
        return torch.optim.Adam(params, lr=1e-2)

    trainer = ModuleTrainer(
        BnNet(), x, y, loss=loss, optimizer=optimizer, train={"batch_size": 10}
    )
    trainer.train_delta(1, _global(), delta_scale=1.0)

    assert calls == {"loss": 4, "optimizer": 1}


def test_float_targets_train_with_a_regression_loss() -> None:
    x, _ = _data()
    target = x[:, :1] * 2.0
    trainer = ModuleTrainer(
        BnNet(outputs=1),
        x,
        target,
        loss=lambda out, t: ((out - t) ** 2).mean(dim=1),
        train={"epochs": 3},
    )
    start = state_dict_to_arrays(BnNet(outputs=1))
    result = trainer.train_delta(1, start, delta_scale=1.0)
    evaluation = trainer.evaluate(start)

    assert result.num_examples == len(x)
    assert np.isnan(evaluation.accuracy) and evaluation.mean_loss > 0
    with pytest.raises(ValueError, match="float targets"):
        _ = trainer.labels


def test_a_mean_loss_cannot_carry_sample_weights() -> None:
    x, y = _data()
    trainer = ModuleTrainer(
        BnNet(),
        x,
        y,
        loss=nn.CrossEntropyLoss(),
        sample_weights=np.linspace(0.1, 2.0, len(y)),
    )
    with pytest.raises(TrainingError, match="reduction='none'"):
        trainer.train_delta(1, _global(), delta_scale=1.0)


def test_another_models_weights_are_refused_naming_the_tensor() -> None:
    x, y = _data()
    trainer = ModuleTrainer(BnNet(hidden=8), x, y)

    with pytest.raises(ModelMismatchError) as caught:
        trainer.check_arrays(state_dict_to_arrays(BnNet(hidden=9)))

    assert caught.value.tensor == "net.0.weight"
    assert "(8, 4) in this device's model, (9, 4) in the federation's" in str(
        caught.value
    )


def test_load_arrays_keeps_the_counter_an_integer() -> None:
    net = BnNet()
    arrays = state_dict_to_arrays(net)
    arrays["net.1.num_batches_tracked"] = np.array(7, dtype=np.int64)
    load_arrays(net, arrays)
    tracked = net.state_dict()["net.1.num_batches_tracked"]
    assert tracked.dtype == torch.int64 and int(tracked) == 7


def test_federated_evaluation_counts_the_held_out_split_per_class() -> None:
    x, y = _data(60)
    trainer = ModuleTrainer(BnNet(), x[:40], y[:40], eval_x=x[40:], eval_y=y[40:])
    assert trainer.evaluates and not ModuleTrainer(BnNet(), x, y).evaluates
    arrays = _global()
    counts = trainer.class_counts(arrays)
    assert counts is not None
    model = BnNet()
    load_arrays(model, arrays)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x[40:])).argmax(dim=1).numpy()
    hits = predicted == y[40:]
    assert counts.total.tolist() == np.bincount(y[40:], minlength=3).tolist()
    assert counts.correct.tolist() == [int(hits[y[40:] == c].sum()) for c in range(3)]


def test_an_onnx_example_exports_the_final_model_as_onnxruntime_runs_it() -> None:
    pytest.importorskip("onnxruntime")
    from ursa.edge_sdk.federation_end import onnx_of
    from ursa.models import OnnxClassifier

    x, y = _data()
    module = BnNet()
    trainer = ModuleTrainer(module, x, y, onnx_example=x[:1])
    final = _global()
    before = state_dict_to_arrays(module)

    onnx = onnx_of(trainer, final)

    assert onnx is not None
    reference = BnNet()
    load_arrays(reference, final)
    reference.eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(x[:5])).numpy()
    np.testing.assert_allclose(OnnxClassifier(onnx).logits(x[:5]), expected, atol=1e-5)
    after = state_dict_to_arrays(module)  # the app's module itself is untouched
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_without_an_onnx_example_only_the_weights_are_saved() -> None:
    from ursa.edge_sdk.federation_end import onnx_of

    x, y = _data()
    assert onnx_of(ModuleTrainer(BnNet(), x, y), _global()) is None


def test_an_onnx_example_of_another_shape_is_refused() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match=r"onnx_example has shape \(1, 5\)"):
        ModuleTrainer(BnNet(), x, y, onnx_example=np.zeros((1, 5), np.float32))
