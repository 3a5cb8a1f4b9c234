"""Model checkpoints: versions, atomic files, pruning, open-round state."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from ursa.coordinator.aggregation import (
    DeviceDelta,
    Weighting,
    apply_update,
    init_aggregation,
)
from ursa.coordinator.model_store import (
    ModelStore,
    ModelStoreError,
    ModelVersion,
    UnsafeModelError,
    check_model,
    signed_spec,
    write_atomic,
)
from ursa.models.weights import arrays_to_bytes

ARRAYS = {
    "w": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.ones(2, np.float32),
}


def _shifted(by: float) -> dict[str, np.ndarray]:
    return {k: v + np.float32(by) for k, v in ARRAYS.items()}


def test_versions_are_saved_loaded_and_pointed_to(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "classifier")
    assert store.latest() is None

    store.save(0, ARRAYS, round_index=0)
    saved = store.save(1, _shifted(1.0), round_index=4)

    latest = store.latest()
    assert latest == saved and (latest.version, latest.round) == (1, 4)
    loaded = store.load_arrays(latest)
    np.testing.assert_array_equal(loaded["w"], ARRAYS["w"] + 1)
    assert not [p for p in store.path.iterdir() if p.name.endswith(".tmp")]


def test_versions_must_increase_and_old_ones_are_pruned(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "classifier", keep=2)
    for version in range(4):
        store.save(version, _shifted(version), round_index=version)

    with pytest.raises(ModelStoreError, match="not newer"):
        store.save(3, ARRAYS, round_index=9)
    files = sorted(p.name for p in store.path.glob("v*.ursw"))
    assert files == ["v000002.ursw", "v000003.ursw"]


def test_a_corrupt_checkpoint_is_detected(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "classifier")
    saved = store.save(0, ARRAYS, round_index=0)
    data = bytearray(saved.path.read_bytes())
    data[-1] ^= 0xFF
    saved.path.write_bytes(bytes(data))

    with pytest.raises(ModelStoreError, match="sha256"):
        store.load_bytes(saved)
    (store.path / "latest.json").write_text("{not json")
    with pytest.raises(ModelStoreError, match="corrupt"):
        store.latest()


def test_initial_weights_are_imported_once(tmp_path: Path) -> None:
    initial = tmp_path / "init.ursw"
    initial.write_bytes(arrays_to_bytes(ARRAYS))
    store = ModelStore(tmp_path / "state", "classifier")

    first = store.import_initial(initial)
    store.save(1, _shifted(2.0), round_index=1)
    again = store.import_initial(initial)

    assert first.version == 0 and again.version == 1
    (tmp_path / "bad.ursw").write_bytes(b"nope")
    with pytest.raises(ModelStoreError, match="unusable"):
        ModelStore(tmp_path / "other", "classifier").import_initial(
            tmp_path / "bad.ursw"
        )


def test_an_open_round_survives_a_restart(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "classifier")
    state = init_aggregation(ARRAYS, Weighting.FEDAVG)
    state, _ = apply_update(state, DeviceDelta("d1", _shifted(0.5), 3))

    store.save_partial(7, 2, state)
    restored = ModelStore(tmp_path, "classifier").load_partial(7, 2)

    assert restored is not None
    assert restored.device_ids == {"d1"} and restored.total_weight == 3.0
    assert restored.weighting is Weighting.FEDAVG
    for name, value in state.weighted_sum.items():
        np.testing.assert_array_equal(restored.weighted_sum[name], value)
    assert store.load_partial(7, 3) is None, "another base version does not resume"
    store.clear_round(7)
    assert store.load_partial(7, 2) is None


def test_write_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "file.bin"
    write_atomic(target, b"first version")
    write_atomic(target, b"2nd")

    assert target.read_bytes() == b"2nd"
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_model_is_never_saved(tmp_path: Path, bad: float) -> None:
    store = ModelStore(tmp_path, "classifier")
    store.save(0, ARRAYS, round_index=0)
    broken = _shifted(1.0)
    broken["w"][1, 2] = bad
    with pytest.raises(UnsafeModelError, match="'w' holds 1 NaN or inf"):
        store.save(1, broken, round_index=1)
    latest = store.latest()
    assert latest is not None and latest.version == 0
    assert not (store.path / "v000001.ursw").exists()


def test_a_model_whose_arrays_changed_is_not_saved(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "classifier")
    other = {"w": np.zeros((3, 2), np.float32), "b": np.ones(2, np.float32)}
    with pytest.raises(UnsafeModelError, match="arrays changed"):
        store.save(1, other, round_index=1, like=ARRAYS)
    check_model(_shifted(2.0), like=ARRAYS)  # same names and shapes: fine


def test_a_non_finite_checkpoint_or_initial_file_is_refused(tmp_path: Path) -> None:
    broken = _shifted(0.0)
    broken["b"][:] = np.float32(np.inf)
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(broken))
    with pytest.raises(UnsafeModelError):
        ModelStore(tmp_path, "a").import_initial(initial)
    store = ModelStore(tmp_path, "b")  # an older ursa wrote an inf version
    write_atomic(store.path / "v000003.ursw", arrays_to_bytes(broken))
    path = store.path / "v000003.ursw"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    old = ModelVersion("b", 3, 3, digest, path.stat().st_size, path)
    with pytest.raises(UnsafeModelError):
        store.load_arrays(old)


def test_the_signed_spec_names_every_tensor_its_shape_and_kind() -> None:
    arrays = {
        "fc.weight": np.zeros((3, 8), dtype=np.float32),
        "bn.num_batches_tracked": np.zeros((), dtype=np.int64),
    }
    spec = signed_spec("classifier", arrays)
    assert spec is not None and spec.model == "classifier"
    assert spec.triples() == (
        ("fc.weight", (3, 8), "float"),
        ("bn.num_batches_tracked", (), "int"),
    )


def test_a_model_past_the_specs_bounds_is_not_signed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    arrays = {f"t{i}": np.zeros(1, dtype=np.float32) for i in range(5000)}
    assert signed_spec("classifier", arrays) is None
    assert "the model's tensor spec is not signed into the key epochs" in caplog.text


def test_the_training_plugin_signs_its_models_spec(tmp_path: Path) -> None:
    from ursa.coordinator.plugin import CoordinatorView, NoSteps, PluginContext
    from ursa.coordinator.training import TrainingPlugin

    initial = tmp_path / "initial.ursw"
    arrays = {"w": np.zeros((3, 4), dtype=np.float32)}
    initial.write_bytes(arrays_to_bytes(arrays))
    unread = PluginContext(cast(CoordinatorView, object()), NoSteps())
    plugin = TrainingPlugin(
        unread, federation="fed", state_dir=tmp_path, initial_weights=initial
    )
    spec = plugin.model_spec()
    assert spec is not None and spec.triples() == (("w", (3, 4), "float"),)
