"""Config files: one typed, secret-free error; keys counted as a reader counts.

What an app that embeds the SDK gets from `load_device_config` (and the
coordinator's entry point from `load_coordinator_config`): the CLI's one-line
messages, not a pydantic traceback that prints the password.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ursa.coordinator.config import load_coordinator_config
from ursa.edge_sdk.config import load_device_config
from ursa.protocol.config_file import ConfigError

PASSWORD = "123456789"

DEVICE = f"""
device_id = "dev001"
federation = "trial1"
state_dir = "state/dev001"

[broker]
url = "mqtt://127.0.0.1:1883"
username = "dev001"
password = "{PASSWORD}"
"""


def write(tmp_path: Path, text: str, name: str = "device.toml") -> Path:
    path = tmp_path / "configs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_bad_value_is_one_config_error_without_the_password(tmp_path: Path) -> None:
    path = write(tmp_path, DEVICE.replace('username = "dev001"', "keepalive_s = -5"))

    with pytest.raises(ConfigError) as caught:
        load_device_config(path, {})

    text = str(caught.value)
    assert text.startswith(f"{path}: broker.keepalive_s: ")
    assert len(text.splitlines()) == 1
    assert PASSWORD not in text
    assert isinstance(caught.value, ValueError)  # older `except ValueError` holds


def test_a_password_in_a_bad_variable_is_masked(tmp_path: Path) -> None:
    path = write(tmp_path, DEVICE)

    with pytest.raises(ConfigError) as caught:
        load_device_config(path, {"URSA_BROKER__PASSWORD": '{"not": "a string"}'})

    assert "URSA_BROKER__PASSWORD: broker.password" in str(caught.value)
    assert '"not"' not in str(caught.value) and PASSWORD not in str(caught.value)


def test_a_misspelt_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, DEVICE.replace("username =", "usernme ="))

    with pytest.raises(ConfigError, match=r"broker\.usernme: .*did you mean username"):
        load_device_config(path, {})


def test_list_entries_are_counted_from_one(tmp_path: Path) -> None:
    text = (
        DEVICE
        + '\n[[methods]]\nkind = "dubhe"\n\n[[methods]]\nkind = "climb"\neta_d = -1\n'
    )
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as caught:
        load_device_config(path, {})

    assert "methods #2" in str(caught.value)
    assert "methods.1" not in str(caught.value)


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    text = 'labels_file = "labels.npy"\n' + DEVICE
    path = write(tmp_path, text)

    config = load_device_config(path, {"URSA_FEDERATION": "trial2"})

    assert config.labels_file == path.parent / "labels.npy"
    assert config.state_dir == path.parent / "state" / "dev001"
    other = load_device_config(path, {"URSA_STATE_DIR": "relative/from/env"})
    assert other.state_dir == Path("relative/from/env")  # a variable: as given


def test_a_data_set_spec_is_left_alone_and_an_npz_file_resolved(
    tmp_path: Path,
) -> None:
    base = DEVICE + '\n[training]\narchitecture = "mlp"\ndata_file = "{}"\n'
    for value, expected in (
        ("digits", "digits"),
        ("npz:train.npz", "npz:train.npz"),
        ("train.npz", str(tmp_path / "configs" / "train.npz")),
        ("/data/train.npz", "/data/train.npz"),
    ):
        config = load_device_config(write(tmp_path, base.format(value)), {})
        assert config.training is not None
        assert config.training.data_file == expected


def test_a_coordinator_config_error_is_typed_too(tmp_path: Path) -> None:
    path = write(tmp_path, 'federation = "f"\nstate_dir = "s"\nk = 0\n', "c.toml")

    with pytest.raises(ConfigError, match=r"c\.toml: k: "):
        load_coordinator_config(path, {})


def test_a_file_that_does_not_parse_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "device_id = \n", "broken.toml")

    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_device_config(path, {})
