"""Coordinator configuration: files, env overrides, validation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from ursa.coordinator import config as coordinator_config
from ursa.coordinator.config import CoordinatorConfig, load_coordinator_config
from ursa.edge_sdk import config as device_config
from ursa.protocol.broker_config import BrokerConfig

TOML = """
federation = "trial1"
state_dir = "/tmp/ursa-state"
min_devices = 30
k = 10
tries = 5

[broker]
url = "mqtt://127.0.0.1:1884"
username = "coordinator"

[enrolment]
mode = "tofu"

[deadlines]
volunteer_s = 3.5
"""


def test_toml_with_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.toml"
    path.write_text(TOML)
    env = {
        "URSA_K": "12",
        "URSA_BROKER__PASSWORD": "s3cret",
        "URSA_DEADLINES__AGENT_S": "2.5",
        "URSA_REQUIRE_MOSQUITTO": "1",  # not a config field: ignored
        "HOME": "/root",
    }
    config = load_coordinator_config(path, env)
    assert (config.federation, config.k, config.tries) == ("trial1", 12, 5)
    assert config.deadlines.volunteer_s == 3.5 and config.deadlines.agent_s == 2.5
    assert config.enrolment.mode == "tofu"
    assert config.broker.password is not None
    assert config.broker.password.get_secret_value() == "s3cret"
    mqtt = config.broker.mqtt_config("coordinator")
    assert (mqtt.host, mqtt.port, mqtt.username) == ("127.0.0.1", 1884, "coordinator")
    assert "s3cret" not in repr(config)


def test_json_file_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"federation": "f", "state_dir": str(tmp_path)}))
    config = load_coordinator_config(path, {})
    assert config.enrolment.mode == "pinned"  # the safe default
    assert config.key_bits == 2048
    assert config.registry.groups == (1, 2, 10)


def test_key_epochs_limit_refusal_re_keys_per_device(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.toml"
    path.write_text(TOML + "\n[key_epochs]\nrefusal_rekeys = 2\n")
    env = {"URSA_KEY_EPOCHS__REFUSAL_WINDOW_S": "600"}
    config = load_coordinator_config(path, env)
    assert config.key_epochs.refusal_rekeys == 2
    assert config.key_epochs.refusal_window_s == 600.0
    default = CoordinatorConfig(federation="f", state_dir=tmp_path).key_epochs
    assert (default.refusal_rekeys, default.refusal_window_s) == (1, 3600.0)
    for bad in ({"refusal_rekeys": -1}, {"refusal_window_s": 0}, {"other": 1}):
        with pytest.raises(ValidationError):
            CoordinatorConfig(federation="f", state_dir=tmp_path, key_epochs=bad)


def test_a_key_epoch_takes_100000_devices_and_more_by_default() -> None:
    config = CoordinatorConfig(federation="f", state_dir=Path("/tmp/s"))
    larger = CoordinatorConfig(
        federation="f", state_dir=Path("/tmp/s"), registry={"max_parties": 10**6}
    )

    assert config.registry.max_parties == 100_000
    assert config.registry.ciphertext_bytes(config.key_bits) == 512  # one
    assert larger.registry.ciphertext_bytes(4096) == 1024


def test_a_registry_too_large_for_one_message_is_refused() -> None:
    wide = {"num_classes": 120, "groups": [1, 2, 3, 120], "sigma": [0.5, 0.2, 0.1, 0]}

    with pytest.raises(ValidationError, match=r"choose smaller registry\.groups"):
        CoordinatorConfig(federation="f", state_dir=Path("/tmp/s"), registry=wide)


@pytest.mark.parametrize(
    "bad",
    [
        {"k": 5, "min_devices": 2},
        {"seal_page_size": 0},
        {"seal_page_size": 257},
        {"key_bits": 1001},
        {"registry": {"num_classes": 10, "groups": [1, 2], "sigma": [0.5, 0.0]}},
        {"registry": {"num_classes": 10, "groups": [1, 10], "sigma": [0.5, 0.1]}},
        {"enrolment": {"mode": "pinned", "pins": {"a": "not-hex"}}},
        {"broker": {"url": "http://x"}},
        {"surprise": 1},
    ],
)
def test_invalid_configs_are_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CoordinatorConfig.model_validate(
            {"federation": "f", "state_dir": tmp_path, **bad}
        )


def test_unknown_file_type(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("x: 1")
    with pytest.raises(ValueError, match=r"toml or \.json"):
        load_coordinator_config(path, {})


def test_both_config_modules_re_export_the_one_broker_config() -> None:
    assert coordinator_config.BrokerConfig is BrokerConfig
    assert device_config.BrokerConfig is BrokerConfig
    assert "BrokerConfig" in coordinator_config.__all__
    assert "BrokerConfig" in device_config.__all__


TRAINING_TOML = """
federation = "trial1"
state_dir = "/tmp/ursa-state"

[[methods]]
kind = "dubhe"

[[methods]]
kind = "climb"
dual_period = 2
dual_timeout_s = 7.0

[training]
initial_weights = "weights.ursw"
update_timeout_s = 30.0
"""


def test_training_section_maps_to_training_config(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.toml"
    path.write_text(TRAINING_TOML)
    config = load_coordinator_config(path, {"URSA_TRAINING__SERVER_LR": "0.5"})
    assert config.method_names() == ("dubhe", "climb")
    assert config.training is not None
    # relative to the config file's folder, not the working directory
    assert config.training.initial_weights == tmp_path / "weights.ursw"
    method = config.training_method()
    assert method is not None and method.kind == "climb"
    assert (method.dual_period, method.dual_timeout_s) == (2, 7.0)
    training = config.training_section().training_config()
    assert training.weighting == "fedavg"  # CLIMB's weighting is its dual step's
    assert training.update_timeout_s == 30.0
    assert training.server_lr == 0.5 and training.model == "classifier"


def test_selection_only_by_default_and_training_section_optional(
    tmp_path: Path,
) -> None:
    base = {"federation": "f", "state_dir": tmp_path}
    plain = CoordinatorConfig.model_validate(base)
    assert plain.training is None and plain.method_names() == ("dubhe",)
    assert plain.training_method() is None
    fedavg = CoordinatorConfig.model_validate(
        {**base, "methods": [{"kind": "dubhe"}, {"kind": "fedavg"}]}
    )
    method = fedavg.training_method()
    assert fedavg.training is None and method is not None
    assert fedavg.training_section().training_config().weighting == "fedavg"
    section = fedavg.training_section()
    assert section.training_config("equal").weighting == "equal"  # the table's say


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"weighting": "climb"}, "weighting moved to a [[methods]] table"),
        ({"feddisk": {"max_made_rounds": 3}}, "feddisk moved to [[methods]]"),
        ({"dual_timeout_s": 3}, "dual_timeout_s moved to [[methods]] kind = 'climb'"),
        ({"update_timeout_s": 0}, "greater than 0"),
        ({"model": "Not A Name"}, "should match pattern"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_training_sections_are_refused(
    tmp_path: Path, bad: dict[str, object], says: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        CoordinatorConfig.model_validate(
            {
                "federation": "f",
                "state_dir": tmp_path,
                "methods": [{"kind": "dubhe"}, {"kind": "fedavg"}],
                "training": bad,
            }
        )


def test_training_section_needs_a_training_method(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a training method"):
        CoordinatorConfig.model_validate(
            {"federation": "f", "state_dir": tmp_path, "training": {}}
        )


DEVICE_TOML = """
device_id = "dev001"
federation = "trial1"
state_dir = "/tmp/ursa-device"

[training]
data_file = "data.npz"
model_options = { input_dim = 64, num_classes = 10, hidden_sizes = [32] }
wire_dtype = "float16"
train = { epochs = 2, lr = 0.1 }

[[methods]]
kind = "dubhe"

[[methods]]
kind = "climb"
eta_d = 0.2
epsilon = 0.01
"""


def test_device_training_section_with_env(tmp_path: Path) -> None:
    path = tmp_path / "device.toml"
    path.write_text(DEVICE_TOML)
    env = {"URSA_TRAINING__SEED": "7"}
    config = device_config.load_device_config(path, env)
    training = config.training
    assert training is not None
    data_file = str(tmp_path / "data.npz")  # beside the config, wherever it runs
    assert (training.data_file, training.architecture) == (data_file, "mlp")
    assert training.model_options["hidden_sizes"] == [32]
    assert training.train == {"epochs": 2, "lr": 0.1}
    climb = config.method_list()[1]
    assert climb.kind == "climb"
    assert (climb.eta_d, climb.epsilon) == (0.2, 0.01)
    assert training.wire_dtype == "float16" and training.seed == 7


@pytest.mark.parametrize(
    "bad",
    [
        {"training": {"model_options": {}}},  # no data_file
        {"training": {"data_file": "d.npz", "model_options": {}, "x": 1}},
        {
            "training": {"data_file": "d.npz", "model_options": {}},
            "labels_file": "l.npy",
        },
        {
            "training": {
                "data_file": "d.npz",
                "model_options": {},
                "wire_dtype": "int8",
            }
        },
    ],
)
def test_invalid_device_training_sections(
    tmp_path: Path, bad: dict[str, object]
) -> None:
    with pytest.raises(ValidationError):
        device_config.DeviceConfig.model_validate(
            {"device_id": "dev001", "federation": "f", "state_dir": tmp_path, **bad}
        )


def test_the_identity_key_lives_in_the_state_dir_unless_the_config_says(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'federation = "f"\nstate_dir = "{tmp_path / "state"}"\n')
    assert load_coordinator_config(path, {}).identity_key_path() == (
        tmp_path / "state" / "identity.key"
    )
    apart = tmp_path / "backup" / "identity.key"
    config = load_coordinator_config(path, {"URSA_IDENTITY_KEY": str(apart)})
    assert config.identity_key_path() == apart
