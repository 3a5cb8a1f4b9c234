"""Tests for ursa.tools.data.loaders, on small files written here in the real format."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from ursa.tools.data.datasets import DatasetError
from ursa.tools.data.loaders import (
    RestrictedUnpickler,
    load_cifar10_batches,
    load_csv,
    load_dataset,
    load_dataset_with_partition,
    load_digits,
    load_leaf_json,
    load_mnist_idx,
    load_npz,
)

# --- digits -------------------------------------------------------------------


def test_digits_shape_range_and_classes() -> None:
    data = load_digits()
    assert data.x.shape == (1797, 1, 8, 8) and data.input_shape == (1, 8, 8)
    assert data.x.dtype == np.float32 and data.y.dtype == np.int64
    assert data.x.min() == 0.0 and data.x.max() == 1.0
    assert data.num_classes == 10
    assert set(data.y.tolist()) == set(range(10))
    assert data.class_counts().min() >= 170


# --- MNIST / EMNIST IDX -----------------------------------------------------------


def _idx_images(images: np.ndarray, magic: int = 2051) -> bytes:
    n, rows, cols = images.shape
    return (
        struct.pack(">IIII", magic, n, rows, cols) + images.astype(np.uint8).tobytes()
    )


def _idx_labels(labels: list[int], magic: int = 2049) -> bytes:
    return struct.pack(">II", magic, len(labels)) + bytes(labels)


@pytest.fixture
def idx_pair() -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    images[0, 0, 0] = 255
    return images, [0, 3, 1, 9, 3]


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_plain_and_gzip(
    tmp_path: Path, idx_pair: tuple[np.ndarray, list[int]], compress: bool
) -> None:
    images, labels = idx_pair
    wrap = gzip.compress if compress else bytes
    (tmp_path / "img").write_bytes(wrap(_idx_images(images)))
    (tmp_path / "lab").write_bytes(wrap(_idx_labels(labels)))
    data = load_mnist_idx(tmp_path / "img", tmp_path / "lab")
    assert data.x.shape == (5, 1, 4, 3) and data.input_shape == (1, 4, 3)
    np.testing.assert_allclose(data.x[:, 0] * 255.0, images, atol=1e-4)
    assert data.x[0, 0, 0, 0] == 1.0
    assert data.y.tolist() == labels and data.num_classes == 10


def test_emnist_transpose(
    tmp_path: Path, idx_pair: tuple[np.ndarray, list[int]]
) -> None:
    images, labels = idx_pair
    (tmp_path / "img").write_bytes(_idx_images(images))
    (tmp_path / "lab").write_bytes(_idx_labels(labels))
    data = load_mnist_idx(tmp_path / "img", tmp_path / "lab", transpose=True)
    assert data.input_shape == (1, 3, 4)
    np.testing.assert_allclose(data.x[2, 0] * 255.0, images[2].T, atol=1e-4)


@pytest.mark.parametrize(
    ("image_bytes", "label_bytes", "match"),
    [
        (lambda im: _idx_images(im, magic=2049), None, "magic"),
        (None, lambda lab: _idx_labels(lab, magic=2051), "magic"),
        (lambda im: _idx_images(im)[:-1], None, "truncated"),
        (lambda im: _idx_images(im) + b"\0", None, "garbled"),
        (None, lambda lab: _idx_labels(lab[:4]), "4 labels"),
        (lambda im: _idx_images(im)[:10], None, "too short"),
        (lambda im: gzip.compress(_idx_images(im))[:-8], None, "gzip"),
        (lambda im: b"\x1f\x8bnot really gzip", None, "gzip"),
    ],
)
def test_mnist_idx_rejects_garbled_files(
    tmp_path: Path,
    idx_pair: tuple[np.ndarray, list[int]],
    image_bytes: object,
    label_bytes: object,
    match: str,
) -> None:
    images, labels = idx_pair
    img = image_bytes(images) if callable(image_bytes) else _idx_images(images)
    lab = label_bytes(labels) if callable(label_bytes) else _idx_labels(labels)
    (tmp_path / "img").write_bytes(img)
    (tmp_path / "lab").write_bytes(lab)
    with pytest.raises(DatasetError, match=match):
        load_mnist_idx(tmp_path / "img", tmp_path / "lab")


def test_mnist_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_mnist_idx(tmp_path / "nope", tmp_path / "nope2")


# --- LEAF / FEMNIST JSON --------------------------------------------------------


def _leaf_doc(users: dict[str, tuple[int, list[int]]], features: int = 784) -> dict:
    doc: dict = {"users": [], "num_samples": [], "user_data": {}}
    for user, (fill, ys) in users.items():
        doc["users"].append(user)
        doc["num_samples"].append(len(ys))
        xs = [[fill / 10.0] * features for _ in ys]
        doc["user_data"][user] = {"x": xs, "y": ys}
    return doc


def test_leaf_json_file_gives_data_and_user_partition(tmp_path: Path) -> None:
    path = tmp_path / "all_data_0.json"
    path.write_text(json.dumps(_leaf_doc({"f0": (1, [0, 5]), "f1": (2, [61, 3, 3])})))
    data, parts = load_leaf_json(path)
    assert data.x.shape == (5, 1, 28, 28) and data.num_classes == 62
    assert data.y.tolist() == [0, 5, 61, 3, 3]
    assert list(parts) == ["f0", "f1"]
    assert parts["f1"].tolist() == [2, 3, 4]
    np.testing.assert_allclose(data.x[parts["f1"]], 0.2)


def test_leaf_json_directory_merges_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_leaf_doc({"u1": (1, [1])}, 6)))
    (tmp_path / "b.json").write_text(json.dumps(_leaf_doc({"u2": (3, [2, 0])}, 6)))
    (tmp_path / "notes.txt").write_text("ignored")
    data, parts = load_leaf_json(tmp_path)
    assert data.input_shape == (6,) and len(data) == 3
    assert parts["u1"].tolist() == [0] and parts["u2"].tolist() == [1, 2]
    np.testing.assert_allclose(data.x[1:], 0.3)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("user_data"), "user_data"),
        (lambda d: d["num_samples"].__setitem__(0, 7), "num_samples"),
        (lambda d: d["user_data"]["u"]["x"].pop(), "shape"),
        (lambda d: d["user_data"]["u"]["x"].__setitem__(0, [0.1]), "numeric|shape"),
        (lambda d: d["user_data"]["u"]["x"].__setitem__(0, ["a"] * 4), "numeric"),
        (lambda d: d["user_data"]["u"].__setitem__("y", [0.5, 1]), "whole"),
        (lambda d: (d["users"].append("ghost"), d["num_samples"].append(0)), "ghost"),
    ],
)
def test_leaf_json_rejects_inconsistent_documents(
    tmp_path: Path, mutate: object, match: str
) -> None:
    doc = _leaf_doc({"u": (1, [0, 1])}, 4)
    assert callable(mutate)
    mutate(doc)
    (tmp_path / "d.json").write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=match):
        load_leaf_json(tmp_path / "d.json")


def test_leaf_json_rejects_garbled_json_and_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text('{"users": ["u"], "user_data": {')
    with pytest.raises(DatasetError, match="LEAF JSON"):
        load_leaf_json(tmp_path / "d.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match=r"no \*\.json"):
        load_leaf_json(empty)


def test_leaf_json_rejects_feature_length_mismatch_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_leaf_doc({"u1": (1, [1])}, 6)))
    (tmp_path / "b.json").write_text(json.dumps(_leaf_doc({"u2": (1, [1])}, 5)))
    with pytest.raises(DatasetError, match="features"):
        load_leaf_json(tmp_path)


# --- CIFAR-10 python batches ------------------------------------------------------


def _py2_str(b: bytes) -> bytes:  # SHORT_BINSTRING / BINSTRING: a Python 2 str
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b
    return b"T" + struct.pack("<i", len(b)) + b


def _py2_int(n: int) -> bytes:
    return b"K" + bytes([n]) if 0 <= n < 256 else b"J" + struct.pack("<i", n)


def _python2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """The bytes Python 2's cPickle wrote for a CIFAR-10 batch (protocol 2)."""
    rows, cols = data.shape
    s, i = _py2_str, _py2_int
    dtype = (
        b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R(" + i(3) + s(b"|")
        + b"NNN" + i(-1) + i(-1) + i(0) + b"tb"
    )  # fmt: skip
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85"
        + s(b"b") + b"\x87R(" + i(1) + i(rows) + i(cols) + b"\x86" + dtype + b"\x89"
        + s(data.tobytes()) + b"tb"
    )  # fmt: skip
    label_list = b"](" + b"".join(i(v) for v in labels) + b"e"
    return (
        b"\x80\x02}(" + s(b"batch_label") + s(b"training batch 1 of 5")
        + s(b"data") + array + s(b"labels") + label_list + b"u."
    )  # fmt: skip


def _batch(seed: int, n: int = 3) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    return data, [int(v) for v in rng.integers(0, 10, size=n)]


def _write_cifar(directory: Path, protocol: int | None) -> dict[str, tuple]:
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        data, labels = _batch(seed)
        if protocol is None:
            raw = _python2_batch(data, labels)
        else:
            doc = {b"batch_label": b"x", b"labels": labels, b"data": data}
            doc[b"filenames"] = [b"a.png"] * len(labels)
            raw = pickle.dumps(doc, protocol=protocol)
        (directory / name).write_bytes(raw)
        written[name] = (data, labels)
    return written


@pytest.mark.parametrize("protocol", [None, 2, 4, 5])
def test_cifar10_batches_in_each_pickle_flavour(
    tmp_path: Path, protocol: int | None
) -> None:
    written = _write_cifar(tmp_path, protocol)
    train = load_cifar10_batches(tmp_path)
    assert train.x.shape == (15, 3, 32, 32) and train.num_classes == 10
    first, first_labels = written["data_batch_1"]
    assert train.y[:3].tolist() == first_labels
    # row layout: 1024 red, then green, then blue, each row-major 32x32
    np.testing.assert_allclose(train.x[1, 1] * 255, first[1, 1024:2048].reshape(32, 32))
    assert train.x.min() >= 0.0 and train.x.max() <= 1.0
    test = load_cifar10_batches(tmp_path, split="test")
    assert test.y.tolist() == written["test_batch"][1]
    assert len(load_cifar10_batches(tmp_path, split="all")) == 18


def test_cifar10_accepts_the_parent_of_the_batch_folder(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py", 2)
    assert len(load_cifar10_batches(tmp_path)) == 15


def test_cifar10_rejects_missing_truncated_and_wrong_batches(tmp_path: Path) -> None:
    _write_cifar(tmp_path, 4)
    raw = (tmp_path / "data_batch_3").read_bytes()
    (tmp_path / "data_batch_3").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetError, match="data_batch_3"):
        load_cifar10_batches(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps({b"data": [1, 2]}))
    with pytest.raises(DatasetError, match="uint8"):
        load_cifar10_batches(tmp_path)
    data, _ = _batch(0)
    (tmp_path / "data_batch_3").write_bytes(
        pickle.dumps({b"data": data, b"labels": [1, 2]})
    )
    with pytest.raises(DatasetError, match="3 images but 2 labels"):
        load_cifar10_batches(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(
        pickle.dumps({b"data": data, b"labels": [1, 2, 10]})
    )
    with pytest.raises(DatasetError, match=r"not in 0\.\.9"):
        load_cifar10_batches(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(DatasetError, match="dict"):
        load_cifar10_batches(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DatasetError, match="no such"):
        load_cifar10_batches(tmp_path)


class _RunsShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _CallsEval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _CallsNumpyLoad:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (np.load, ("/dev/null",))


@pytest.mark.parametrize("payload", [_RunsShell, _CallsEval, _CallsNumpyLoad])
def test_restricted_unpickler_refuses_malicious_batch(
    tmp_path: Path, payload: type
) -> None:
    marker = tmp_path / "pwned"
    evil = payload(marker) if payload is not _CallsNumpyLoad else payload()
    _write_cifar(tmp_path, 4)
    (tmp_path / "data_batch_1").write_bytes(
        pickle.dumps({b"data": evil, b"labels": [0]}, protocol=2)
    )
    with pytest.raises(DatasetError, match="refusing to load global"):
        load_cifar10_batches(tmp_path)
    assert not marker.exists()


def test_restricted_unpickler_only_allows_latin1_codec() -> None:
    import io

    raw = b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R."
    with pytest.raises(pickle.UnpicklingError, match="latin-1"):
        RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()


# --- npz -----------------------------------------------------------------------


def test_npz_roundtrip_and_custom_keys(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    np.savez(tmp_path / "d.npz", features=x, labels=np.array([2, 0, 1]))
    data = load_npz(tmp_path / "d.npz", x_key="features", y_key="labels")
    assert data.x.shape == (3, 2, 2) and data.x.dtype == np.float32
    np.testing.assert_array_equal(data.x, x)  # cast unchanged, not rescaled
    assert data.y.tolist() == [2, 0, 1] and data.num_classes == 3 and data.name == "d"


def test_npz_rejects_bad_archives(tmp_path: Path) -> None:
    np.savez(tmp_path / "keys.npz", a=np.zeros((2, 2)), y=np.zeros(2))
    with pytest.raises(DatasetError, match="'x'"):
        load_npz(tmp_path / "keys.npz")
    objects = np.array([{"a": 1}, None], dtype=object)
    np.savez(tmp_path / "obj.npz", x=np.zeros((2, 2)), y=objects)
    with pytest.raises(DatasetError, match="readable"):
        load_npz(tmp_path / "obj.npz")
    np.save(tmp_path / "bare.npy", np.zeros((2, 2)))
    with pytest.raises(DatasetError, match="npy"):
        load_npz(tmp_path / "bare.npy")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(DatasetError):
        load_npz(tmp_path / "junk.npz")
    np.savez(tmp_path / "flat.npz", x=np.zeros(3), y=np.zeros(3))
    with pytest.raises(DatasetError, match="shape"):
        load_npz(tmp_path / "flat.npz")
    with pytest.raises(DatasetError, match="no such file"):
        load_npz(tmp_path / "missing.npz")


# --- CSV -----------------------------------------------------------------------


def test_csv_with_header_and_named_label(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("\ufefff1,label,f2\n0.5,1,2\n1.5,0,3\n\n")
    data = load_csv(tmp_path / "t.csv")
    assert data.x.tolist() == [[0.5, 2.0], [1.5, 3.0]]
    assert data.y.tolist() == [1, 0] and data.num_classes == 2


def test_csv_without_header_by_index(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("7,0.1,3\n2, 0.3,4\n")
    data = load_csv(tmp_path / "t.csv", label_column=0)
    assert data.y.tolist() == [7, 2] and data.num_classes == 8
    np.testing.assert_allclose(data.x, [[0.1, 3], [0.3, 4]])
    last = load_csv(tmp_path / "t.csv", label_column=-1, has_header=False)
    assert last.y.tolist() == [3, 4]
    np.testing.assert_allclose(last.x, [[7, 0.1], [2, 0.3]])
    with pytest.raises(DatasetError, match="whole"):
        load_csv(tmp_path / "t.csv", label_column=1)


@pytest.mark.parametrize(
    ("text", "kwargs", "match"),
    [
        ("1,2\n3,4\n", {}, "no header"),
        ("a,b\n1,2\n", {}, "no column 'label'"),
        ("label,a\n1,2\n3\n", {}, "row 3"),
        ("label,a\n1,x\n", {"has_header": True}, "non-numeric"),
        ("1,2\n", {"label_column": 5}, "outside"),
        ("label,a\n", {}, "data rows"),
        ("", {}, "empty"),
    ],
)
def test_csv_rejects_bad_files(
    tmp_path: Path, text: str, kwargs: dict, match: str
) -> None:
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(DatasetError, match=match):
        load_csv(tmp_path / "t.csv", **kwargs)


# --- dispatcher ------------------------------------------------------------------


def test_load_dataset_dispatches_every_kind(
    tmp_path: Path, idx_pair: tuple[np.ndarray, list[int]]
) -> None:
    images, labels = idx_pair
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(_idx_images(images))
    )
    (tmp_path / "train-labels.idx1-ubyte").write_bytes(_idx_labels(labels))
    img, lab = (
        tmp_path / "train-images-idx3-ubyte.gz",
        tmp_path / "train-labels.idx1-ubyte",
    )
    assert len(load_dataset(f"mnist:{img},{lab}")) == 5
    assert load_dataset(f"mnist:{tmp_path}").name == "mnist"
    assert load_dataset(f"emnist:{img},{lab}").input_shape == (1, 3, 4)
    (tmp_path / "u.json").write_text(json.dumps(_leaf_doc({"u": (1, [0, 1])}, 4)))
    data, parts = load_dataset_with_partition(f"leaf:{tmp_path / 'u.json'}")
    assert len(data) == 2 and parts is not None and list(parts) == ["u"]
    _write_cifar(tmp_path / "c", 4)
    assert len(load_dataset(f"cifar10:{tmp_path / 'c'}")) == 15
    assert len(load_dataset(f"cifar10-test:{tmp_path / 'c'}")) == 3
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 3)), y=np.array([0, 1]))
    assert len(load_dataset(f"npz:{tmp_path / 'd.npz'}")) == 2
    (tmp_path / "d.csv").write_text("label,a\n1,2\n")
    assert load_dataset_with_partition(f"csv:{tmp_path / 'd.csv'}")[1] is None
    assert load_dataset("digits").name == "digits"


@pytest.mark.parametrize("spec", ["", "mnist", "imagenet:/x", "digits:/x", "mnist:/x"])
def test_load_dataset_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(DatasetError):
        load_dataset(spec)
