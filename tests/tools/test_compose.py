"""`ursa.tools.compose`: a coordinator or a device from its config, methods included."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from pydantic import ValidationError

from ursa.coordinator.before_training import StepContext
from ursa.coordinator.plugin import CoordinatorView, PluginContext, RoundPlugin
from ursa.coordinator.step_runner import StepRunner
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.edge_sdk.methods.flicker.method import Flicker
from ursa.tools import compose
from ursa.tools.cli import service as cli_service

DUBHE = {"kind": "dubhe"}
UNREAD_VIEW = cast(CoordinatorView, object())
"""A view for building a plugin and its steps: they keep it and read it per round."""


def _built(
    config: Any, view: CoordinatorView = UNREAD_VIEW
) -> tuple[RoundPlugin, StepRunner]:
    """The config's training plugin and steps, built as the service builds them.

    Raises:
        ServiceSetupError: as `compose.training_plugin`, or when building.
    """
    build = compose.training_plugin(config)
    assert build is not None
    steps = StepRunner(
        StepContext("f", view, lambda m, d: None, lambda: 0.0),
        compose.before_training_steps(config),
    )
    return build(PluginContext(view, steps)), steps


def test_labels_from_npy_and_text(tmp_path: Path) -> None:
    np.save(tmp_path / "l.npy", np.array([0, 3, 3, 9]))
    (tmp_path / "l.csv").write_text("0, 3,3\n9\n")
    for name in ("l.npy", "l.csv"):
        assert compose.load_labels(tmp_path / name).tolist() == [0, 3, 3, 9]


def test_bad_label_files_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "f.npy", np.array([0.5, 1.0]))
    (tmp_path / "n.txt").write_text("1 -2")
    with pytest.raises(ValueError, match="integers"):
        compose.load_labels(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="non-negative"):
        compose.load_labels(tmp_path / "n.txt")


def _weights(tmp_path: Path, *extra: str, name: str = "w.ursw") -> Path:
    out = tmp_path / name
    argv = ["model", "init", "--classes", "10", "--out", str(out), *extra]
    assert cli_service.main(argv) == 0
    return out


def _coordinator(
    tmp_path: Path, methods: list[dict[str, Any]], training: dict[str, Any] | None
) -> Any:
    from ursa.coordinator.config import CoordinatorConfig

    return CoordinatorConfig.model_validate(
        {
            "federation": "f",
            "state_dir": tmp_path / "c",
            "methods": methods,
            "training": training,
        }
    )


def test_training_plugin_of_the_training_method(tmp_path: Path) -> None:
    from ursa.coordinator.methods.climb import ClimbDualStep
    from ursa.coordinator.training import TrainingPlugin

    assert compose.training_plugin(_coordinator(tmp_path, [DUBHE], None)) is None
    climb = [DUBHE, {"kind": "climb", "dual_period": 2}]
    with pytest.raises(compose.ServiceSetupError, match="initial weights"):
        _built(_coordinator(tmp_path, climb, {}))
    section = {"initial_weights": str(_weights(tmp_path, "--input-dim", "8"))}
    plugin, steps = _built(_coordinator(tmp_path, climb, section))
    assert isinstance(plugin, TrainingPlugin)
    (step,) = steps.steps  # the runtime's, not the plugin's
    assert isinstance(step, ClimbDualStep) and step.spec.dual_period == 2
    assert plugin.version == 0 and plugin.weighting == "climb"
    assert plugin.methods() == ("climb",)
    assert (tmp_path / "c" / "models" / "classifier").is_dir()


def test_the_service_signs_the_configs_methods(tmp_path: Path) -> None:
    from ursa.coordinator.service import CoordinatorService
    from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport

    section = {"initial_weights": str(_weights(tmp_path, "--input-dim", "8"))}
    config = _coordinator(tmp_path, [DUBHE, {"kind": "fedavg"}], section)
    transport = InMemoryTransport(InMemoryBus(), "coordinator")
    service = compose.build_coordinator(config, transport=transport)
    assert config.method_names() == ("dubhe", "fedavg")
    # a plugin that runs another method than the config names is refused
    climb_config = _coordinator(tmp_path, [DUBHE, {"kind": "climb"}], section)
    climb = compose.training_plugin(climb_config)
    assert climb is not None
    says = "names fedavg, the training plugin runs climb"
    with pytest.raises(ValueError, match=says):
        CoordinatorService(
            config,
            plugin=climb,
            steps=compose.before_training_steps(climb_config),
            transport=transport,
        )
    del service


def test_feddisk_method_builds_the_two_phase_plugin(tmp_path: Path) -> None:
    from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin

    section = {"initial_weights": str(_weights(tmp_path, "--input-dim", "8"))}
    feddisk: dict[str, Any] = {"kind": "feddisk", "max_made_rounds": 7}
    with pytest.raises(compose.ServiceSetupError, match="initial weights"):
        _built(_coordinator(tmp_path, [DUBHE, feddisk], section))
    made = _weights(tmp_path, "--model", "made", "--input-dim", "8", name="m.ursw")
    feddisk["made_initial_weights"] = str(made)
    store = CoordinatorStore(tmp_path / DB_FILENAME)  # FedDisk's progress is in it
    try:
        view = cast(CoordinatorView, SimpleNamespace(store=store))
        plugin, _ = _built(_coordinator(tmp_path, [DUBHE, feddisk], section), view)
        assert isinstance(plugin, FeddiskPlugin)
        assert plugin.phase == "made" and plugin.made_rounds == 0
    finally:
        store.close()
    assert plugin.config.max_made_rounds == 7 and plugin.methods() == ("feddisk",)
    assert plugin.made.config.model == "made" and plugin.made.version == 0
    assert plugin.classifier.config.model == "classifier"
    assert plugin.classifier.config.weighting == "fedavg"
    with pytest.raises(ValidationError, match="max_made_rounds"):
        _coordinator(tmp_path, [DUBHE, {**feddisk, "max_made_rounds": 0}], section)


def _device(tmp_path: Path, **fields: Any) -> Any:
    from ursa.edge_sdk.config import DeviceConfig

    return DeviceConfig.model_validate(
        {"device_id": "dev001", "federation": "f", "state_dir": tmp_path, **fields}
    )


def _training(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((12, 4)), y=np.arange(12) % 3)
    return {
        "data_file": str(tmp_path / "d.npz"),
        "model_options": {"input_dim": 4, "num_classes": 3},
        "train": {"epochs": 2},
        "wire_dtype": "float16",
    }


def test_training_device_gets_a_torch_trainer(tmp_path: Path) -> None:
    from ursa.edge_sdk.torch_trainer import TorchTrainer

    training = _training(tmp_path)
    client = compose.build_device(_device(tmp_path, training=training))
    trainer = client.data.trainer
    assert isinstance(trainer, TorchTrainer)
    assert client.methods() == ("dubhe", "fedavg")
    assert trainer.num_examples == 12 and trainer.wire_dtype == "float16"
    assert trainer.seed == compose.device_seed("dev001")
    assert client.data.labels.tolist() == (np.arange(12) % 3).tolist()
    with pytest.raises(compose.ServiceSetupError, match="labels"):
        compose.build_device(_device(tmp_path, training=training), Path("l.npy"))
    bad_fields: list[tuple[dict[str, Any], str]] = [
        ({"data_file": str(tmp_path / "none.npz")}, "no such file"),
        ({"model_options": {"input_dim": 4}}, "num_classes"),
        ({"train": {"epochs": 0}}, "epochs"),
    ]
    for bad, match in bad_fields:
        with pytest.raises(compose.ServiceSetupError, match=match):
            compose.build_device(_device(tmp_path, training={**training, **bad}))


def test_climb_settings_come_from_the_methods_table(tmp_path: Path) -> None:
    from ursa.edge_sdk.methods.climb.method import Climb

    methods = [DUBHE, {"kind": "climb", "eta_d": 0.3}]
    config = _device(tmp_path, training=_training(tmp_path), methods=methods)
    client = compose.build_device(config)
    assert client.methods() == ("dubhe", "climb")
    assert client.method(Climb).config.eta_d == 0.3


def test_feddisk_device_wraps_its_torch_trainer(tmp_path: Path) -> None:
    from ursa.edge_sdk.methods.feddisk.trainer import FeddiskTrainer

    training = _training(tmp_path)
    methods = [DUBHE, {"kind": "feddisk", "made_hidden_sizes": [8]}]
    client = compose.build_device(_device(tmp_path, training=training, methods=methods))
    assert isinstance(client.data.trainer, FeddiskTrainer)
    assert client.data.trainer.phase == "made" and client.data.trainer.model == "made"
    assert client.methods() == ("dubhe", "feddisk")
    with pytest.raises(ValidationError, match="made_lr"):
        _device(
            tmp_path,
            training=training,
            methods=[DUBHE, {"kind": "feddisk", "made_lr": -1.0}],
        )


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"methods": [{"kind": "fedavg"}]}, "needs a selection method"),
        ({"training_climb": True}, "climb moved to a [[methods]] table"),
    ],
)
def test_device_method_lists_that_cannot_run(
    tmp_path: Path, fields: dict[str, Any], says: str
) -> None:
    if fields.pop("training_climb", False):
        fields["training"] = {**_training(tmp_path), "climb": {}}
    with pytest.raises(ValidationError, match=re.escape(says)):
        _device(tmp_path, **fields)


def test_device_run_refuses_a_training_method_without_training_data(
    tmp_path: Path,
) -> None:
    config = _device(tmp_path, methods=[DUBHE, {"kind": "climb"}])
    with pytest.raises(compose.ServiceSetupError, match="climb trains: add a"):
        compose.build_device(config, tmp_path / "labels.npy")


def test_training_device_without_a_training_method_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a training method"):
        _device(tmp_path, training=_training(tmp_path), methods=[DUBHE])


def test_selection_only_device_runs_without_torch(tmp_path: Path) -> None:
    np.save(tmp_path / "l.npy", np.array([0, 1, 1]))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ursa.edge_sdk.config import DeviceConfig\n"
        "from ursa.tools.compose import build_device\n"
        f"root = Path({str(tmp_path)!r})\n"
        "config = DeviceConfig(device_id='dev001', federation='f', state_dir=root,"
        " labels_file=root / 'l.npy')\n"
        "client = build_device(config)\n"
        "assert client.data.labels.tolist() == [0, 1, 1]\n"
        "assert client.methods() == ('dubhe',)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with pytest.raises(compose.ServiceSetupError, match="labels"):
        compose.build_device(_device(tmp_path))


def test_flicker_on_both_sides_builds_each_half(tmp_path: Path) -> None:
    pytest.importorskip("tenseal")
    from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport

    config = _coordinator(tmp_path, [DUBHE, {"kind": "flicker", "nabla": 0.2}], None)
    transport = InMemoryTransport(InMemoryBus(), "coordinator")
    service = compose.build_coordinator(config, transport=transport)
    from ursa.coordinator.methods.flicker.method import FlickerMethod

    assert isinstance(service.balancing, FlickerMethod)
    assert service.balancing.spec.nabla == 0.2
    assert config.method_names() == ("dubhe", "flicker")
    key = config.state_dir / "ckks.key"  # made with the method, before any start
    key.chmod(0o644)
    with pytest.raises(compose.ServiceSetupError, match="CKKS key"):
        compose.build_coordinator(config, transport=transport)

    np.save(tmp_path / "l.npy", np.array([0, 1, 1, 2]))
    flicker = [DUBHE, {"kind": "flicker"}]
    device = compose.build_device(
        _device(tmp_path, methods=flicker), tmp_path / "l.npy"
    )
    assert device.methods() == ("dubhe", "flicker")
    assert device.method(Flicker).participant is not None

    np.savez(tmp_path / "f.npz", centroids=np.eye(3, 4), temperature=0.5)
    training = _training(tmp_path)
    methods = [DUBHE, {"kind": "fedavg"}, {"kind": "flicker", "features_file": "f.npz"}]
    with pytest.raises(compose.ServiceSetupError, match="flicker"):
        compose.build_device(_device(tmp_path, training=training, methods=methods))


def test_a_coordinator_architecture_builds_version_0_and_checks_weights(
    tmp_path: Path,
) -> None:
    from ursa.coordinator.training import TrainingPlugin
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_from_bytes

    fedavg = [DUBHE, {"kind": "fedavg"}]
    arch = {"architecture": "mlp", "model_options": {"input_dim": 8, "num_classes": 10}}
    plugin, _ = _built(_coordinator(tmp_path, fedavg, arch))
    assert isinstance(plugin, TrainingPlugin) and plugin.version == 0
    built = arrays_from_bytes((tmp_path / "c" / "initial-classifier.ursw").read_bytes())
    expected = initial_arrays("mlp", arch["model_options"], seed=0)
    assert list(built) == list(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(built[name], value)

    other = tmp_path / "other"
    given = {"initial_weights": str(_weights(tmp_path, "--input-dim", "9"))}
    with pytest.raises(compose.ServiceSetupError, match=r"tensor '.*weight'.*\(.*8\)"):
        compose.training_plugin(_coordinator(other, fedavg, {**arch, **given}))
    # a checkpoint of another model is refused too, before any round
    wider = {**arch, "model_options": {"input_dim": 9, "num_classes": 10}}
    with pytest.raises(compose.ServiceSetupError, match="the checkpoint v0"):
        compose.training_plugin(_coordinator(tmp_path, fedavg, wider))


def test_an_import_path_architecture_on_both_sides(tmp_path: Path) -> None:
    from ursa.coordinator.training import TrainingPlugin
    from ursa.edge_sdk.module_trainer import ModuleTrainer

    factory = "tests.models.spec_factories:softmax"
    section = {"architecture": factory, "model_options": {"features": 4, "classes": 3}}
    plugin, _ = _built(_coordinator(tmp_path, [DUBHE, {"kind": "fedavg"}], section))
    assert isinstance(plugin, TrainingPlugin) and plugin.version == 0
    with pytest.raises(ValidationError, match="neither built in"):
        _coordinator(tmp_path, [DUBHE, {"kind": "fedavg"}], {"architecture": "resnet"})

    torch_factory = "tests.tools.compose_factories:tiny"
    training = {**_training(tmp_path), "architecture": torch_factory}
    training["model_options"] = {"features": 4}
    client = compose.build_device(_device(tmp_path, training=training))
    assert isinstance(client.data.trainer, ModuleTrainer)
    with pytest.raises(ValidationError, match="neither built in"):
        _device(tmp_path, training={**training, "architecture": "pkg/mod:f"})


def test_feddisk_wraps_a_module_trainer_and_its_phase_two_trains_it(
    tmp_path: Path,
) -> None:
    from ursa.edge_sdk.methods.feddisk.trainer import FeddiskTrainer
    from ursa.edge_sdk.module_trainer import ModuleTrainer
    from ursa.models.registry import state_dict_to_arrays

    training = {
        **_training(tmp_path),
        "architecture": "tests.tools.compose_factories:tiny",
    }
    training["model_options"] = {"features": 4}
    methods = [DUBHE, {"kind": "feddisk", "made_hidden_sizes": [8]}]
    client = compose.build_device(_device(tmp_path, training=training, methods=methods))
    trainer = client.data.trainer
    assert isinstance(trainer, FeddiskTrainer)
    assert isinstance(trainer.classifier, ModuleTrainer)

    weights = np.linspace(0.5, 1.5, 12)
    trainer.restore_weights(weights)
    global_arrays = state_dict_to_arrays(trainer.classifier.module)
    delta = trainer.train_delta(1, global_arrays, delta_scale=1.0).delta

    assert trainer.model == "classifier"
    np.testing.assert_array_equal(trainer.classifier.sample_weights, weights)
    assert list(delta) == list(global_arrays)


def test_a_holdout_file_scores_every_version_beside_federated_evaluation(
    tmp_path: Path,
) -> None:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.fleet_eval import FleetEvaluation
    from ursa.coordinator.training import TrainingPlugin
    from ursa.edge_sdk.training import evaluate
    from ursa.models.registry import initial_arrays

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 8)).astype(np.float32), rng.integers(0, 3, 30)
    holdout = tmp_path / "test.npz"
    np.savez(holdout, x=x, y=y)
    options = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [4]}
    fields: dict[str, Any] = {
        "federation": "f",
        "state_dir": tmp_path / "c",
        "methods": [DUBHE, {"kind": "fedavg"}],
        "training": {"architecture": "mlp", "model_options": options},
        "registry": {"num_classes": 3, "groups": [1, 3], "sigma": [0.5, 0.0]},
        "evaluation": {"every": 2, "holdout_file": str(holdout)},
    }
    plugin, steps = _built(CoordinatorConfig.model_validate(fields))
    assert isinstance(plugin, TrainingPlugin)
    (step,) = steps.steps
    assert isinstance(step, FleetEvaluation) and step.num_classes == 3
    score = compose.holdout_evaluator(CoordinatorConfig.model_validate(fields))
    assert score is not None
    arrays = initial_arrays("mlp", options, seed=3)
    figures = score(1, 1, arrays)
    expected = evaluate("mlp", options, arrays, x, y)
    assert figures["accuracy"] == pytest.approx(expected.accuracy)
    assert len(figures["per_class_accuracy"]) == 3
    del fields["training"]["architecture"]
    with pytest.raises(compose.ServiceSetupError, match="needs \\[training\\] arch"):
        compose.holdout_evaluator(CoordinatorConfig.model_validate(fields))


def test_a_missing_holdout_file_is_named_as_the_evaluation_setting(
    tmp_path: Path,
) -> None:
    from ursa.coordinator.config import CoordinatorConfig

    options = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [4]}
    config = CoordinatorConfig.model_validate(
        {
            "federation": "f",
            "state_dir": tmp_path / "c",
            "methods": [DUBHE, {"kind": "fedavg"}],
            "training": {"architecture": "mlp", "model_options": options},
            "registry": {"num_classes": 3, "groups": [1, 3], "sigma": [0.5, 0.0]},
            "evaluation": {"holdout_file": str(tmp_path / "missing.npz")},
        }
    )
    with pytest.raises(compose.ServiceSetupError) as caught:
        compose.holdout_evaluator(config)
    assert str(caught.value).startswith("[evaluation] holdout_file: ")
    assert "[training]" not in str(caught.value)


def _three_class_config(tmp_path: Path, **registry: Any) -> Any:
    from ursa.coordinator.config import CoordinatorConfig

    options = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [4]}
    fields: dict[str, Any] = {
        "federation": "f",
        "state_dir": tmp_path / "c",
        "methods": [DUBHE, {"kind": "fedavg"}],
        "training": {"architecture": "mlp", "model_options": options},
    }
    if registry:
        fields["registry"] = registry
    return CoordinatorConfig.model_validate(fields)


def test_the_registry_follows_a_three_class_model(tmp_path: Path) -> None:
    config = compose.registry_of_the_model(_three_class_config(tmp_path))

    assert config.registry.num_classes == 3
    assert config.registry.groups == (1, 2, 3)
    assert config.registry.sigma == (0.7, 0.1, 0.0)


def test_a_registry_that_names_other_classes_than_the_model_is_refused(
    tmp_path: Path,
) -> None:
    config = _three_class_config(tmp_path, num_classes=10)

    with pytest.raises(compose.ServiceSetupError, match="outputs 3 classes"):
        compose.registry_of_the_model(config)


def test_the_class_count_comes_from_the_initial_weights_without_options(
    tmp_path: Path,
) -> None:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.models.weights import arrays_to_bytes

    weights = tmp_path / "w.ursw"
    arrays = {"w": np.zeros((3, 8), np.float32), "b": np.zeros(3, np.float32)}
    weights.write_bytes(arrays_to_bytes(arrays))
    config = CoordinatorConfig.model_validate(
        {
            "federation": "f",
            "state_dir": tmp_path / "c",
            "methods": [DUBHE, {"kind": "fedavg"}],
            "training": {"initial_weights": str(weights)},
        }
    )

    assert compose.model_classes(config) == 3
    assert compose.registry_of_the_model(config).registry.num_classes == 3
