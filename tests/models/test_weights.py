from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.models.weights import (
    Arrays,
    WeightsError,
    WeightsFormatError,
    WeightsMismatchError,
    WeightsSpecError,
    accumulate_scaled,
    add_scaled,
    arrays_from_bytes,
    arrays_to_bytes,
    flatten,
    num_values,
    spec_of,
    subtract,
    unflatten,
    zeros_like,
)


def _arrays(seed: int = 0) -> Arrays:
    rng = np.random.default_rng(seed)
    return {
        "net.1.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "net.1.bias": rng.normal(size=(4,)).astype(np.float32),
        "scalar": np.asarray(rng.normal(), dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
    }


def test_float32_round_trip_is_exact_and_keeps_order() -> None:
    arrays = _arrays()

    decoded = arrays_from_bytes(arrays_to_bytes(arrays))

    assert list(decoded) == list(arrays)
    for name, arr in arrays.items():
        assert decoded[name].dtype == np.float32
        assert decoded[name].shape == arr.shape
        np.testing.assert_array_equal(decoded[name], arr)


def test_float16_round_trip_is_close_and_half_the_size() -> None:
    rng = np.random.default_rng(1)
    arrays = {"w": rng.normal(size=(64, 64)).astype(np.float32)}

    data16 = arrays_to_bytes(arrays, dtype="float16")
    decoded = arrays_from_bytes(data16)

    assert decoded["w"].dtype == np.float32
    np.testing.assert_allclose(decoded["w"], arrays["w"], rtol=1e-3, atol=1e-3)
    assert len(data16) < 0.55 * len(arrays_to_bytes(arrays))


def test_float16_overflow_raises() -> None:
    with pytest.raises(WeightsError, match="overflows float16"):
        arrays_to_bytes({"w": np.array([1e6], dtype=np.float32)}, dtype="float16")


def test_non_numeric_array_and_unknown_dtype_raise() -> None:
    with pytest.raises(WeightsError, match="not float"):
        arrays_to_bytes({"n": np.array([True, False])})
    with pytest.raises(WeightsError, match="not float"):
        arrays_to_bytes({"n": np.array([1j])})
    with pytest.raises(WeightsError, match="unknown wire dtype"):
        arrays_to_bytes(_arrays(), dtype="int8")  # type: ignore[arg-type]


def test_every_truncation_raises_format_error() -> None:
    data = arrays_to_bytes(_arrays())
    for cut in range(len(data)):
        with pytest.raises(WeightsFormatError):
            arrays_from_bytes(data[:cut])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage bytes that are not weights",
        b"URSW\x09\x01\x00\x00\x00\x00\x00\x00",
    ],
)
def test_garbage_raises_format_error(data: bytes) -> None:
    with pytest.raises(WeightsFormatError):
        arrays_from_bytes(data)


def test_trailing_bytes_and_unknown_dtype_code_raise() -> None:
    data = arrays_to_bytes(_arrays())
    with pytest.raises(WeightsFormatError, match="trailing"):
        arrays_from_bytes(data + b"\x00")
    with pytest.raises(WeightsFormatError, match="dtype code"):
        arrays_from_bytes(data[:5] + b"\x07" + data[6:])


def test_duplicate_names_raise() -> None:
    one = arrays_to_bytes({"a": np.zeros(1, np.float32)})
    header, body = one[:12], one[12:]
    entry, value = body[:-4], body[-4:]
    two = header[:8] + (2).to_bytes(4, "little") + entry + entry + value + value
    with pytest.raises(WeightsFormatError, match="duplicate"):
        arrays_from_bytes(two)


@settings(max_examples=30, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.lists(st.floats(-1e4, 1e4, width=32), max_size=6),
        max_size=4,
    )
)
def test_round_trip_property(raw: dict[str, list[float]]) -> None:
    arrays: Arrays = {k: np.asarray(v, dtype=np.float32) for k, v in raw.items()}
    decoded = arrays_from_bytes(arrays_to_bytes(arrays))
    assert spec_of(decoded) == spec_of(arrays)
    for k in arrays:
        np.testing.assert_array_equal(decoded[k], arrays[k])


def test_flatten_unflatten_round_trip() -> None:
    arrays = _arrays()

    vector, spec = flatten(arrays)
    back = unflatten(vector, spec)

    assert vector.shape == (num_values(arrays),) == (4 * 3 + 4 + 1,)
    for name in arrays:
        np.testing.assert_array_equal(back[name], arrays[name])
    with pytest.raises(WeightsMismatchError):
        unflatten(vector[:-1], spec)


def test_subtract_and_add_scaled_match_numpy() -> None:
    a, b = _arrays(0), _arrays(1)

    diff = subtract(a, b)
    moved = add_scaled(b, diff, 0.5)

    for name in a:
        np.testing.assert_array_equal(diff[name], a[name] - b[name])
        np.testing.assert_allclose(moved[name], b[name] + 0.5 * (a[name] - b[name]))
        assert moved[name].dtype == np.float32


def test_accumulate_scaled_is_a_running_weighted_sum() -> None:
    updates = [_arrays(i) for i in range(4)]
    weights = [1.0, 2.0, 3.0, 4.0]
    acc = zeros_like(updates[0], dtype=np.float64)

    for w, u in zip(weights, updates, strict=True):
        accumulate_scaled(acc, u, w)

    assert acc["net.1.weight"].dtype == np.float64
    expected = sum(
        w * u["net.1.weight"].astype(np.float64)
        for w, u in zip(weights, updates, strict=True)
    )
    np.testing.assert_allclose(acc["net.1.weight"], expected, rtol=1e-12)


def test_mismatched_names_or_shapes_raise() -> None:
    a = _arrays()
    with pytest.raises(WeightsMismatchError, match="names"):
        subtract(a, {"other": np.zeros(1, np.float32)})
    b = dict(a)
    b["net.1.bias"] = np.zeros(5, np.float32)
    with pytest.raises(WeightsMismatchError, match="shape"):
        add_scaled(a, b, 1.0)


def test_weights_and_inference_import_without_torch() -> None:
    code = (
        "import sys, ursa.models.weights, ursa.models.inference; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_integer_buffers_round_trip_as_int64_in_format_two() -> None:
    arrays = {
        **_arrays(),
        "bn.num_batches_tracked": np.array(17, dtype=np.int64),
        "counts": np.array([[0, -3], [2**40, 5]], dtype=np.int64),
    }

    for dtype in ("float32", "float16"):
        data = arrays_to_bytes(arrays, dtype=dtype)
        decoded = arrays_from_bytes(data)

        assert data[4] == 2  # format version 2: a kind byte per entry
        assert list(decoded) == list(arrays)
        assert decoded["bn.num_batches_tracked"].dtype == np.int64
        assert int(decoded["bn.num_batches_tracked"]) == 17
        np.testing.assert_array_equal(decoded["counts"], arrays["counts"])
        assert decoded["net.1.weight"].dtype == np.float32


def test_float_only_payloads_stay_format_one() -> None:
    assert arrays_to_bytes(_arrays())[4] == 1


def test_format_two_truncations_and_bad_kinds_raise() -> None:
    data = arrays_to_bytes({"n": np.array([3], dtype=np.int64)})
    for cut in range(len(data)):
        with pytest.raises(WeightsFormatError):
            arrays_from_bytes(data[:cut])
    kind_at = 12 + 2 + 1  # header, name length, name "n"
    with pytest.raises(WeightsFormatError, match="kind"):
        arrays_from_bytes(data[:kind_at] + b"\x09" + data[kind_at + 1 :])


def test_decoding_against_the_expected_arrays_checks_the_header_first() -> None:
    template = {
        "w": np.zeros((2, 3), np.float32),
        "n": np.zeros((), np.int64),
    }
    good = arrays_to_bytes(
        {"w": np.ones((2, 3), np.float32), "n": np.array(4, np.int64)}
    )
    decoded = arrays_from_bytes(good, template)
    assert decoded["n"] == 4 and decoded["w"].dtype == np.float32
    half = arrays_to_bytes({"w": np.ones((2, 3)), "n": np.ones(())}, dtype="float16")
    assert arrays_from_bytes(half, template)["n"].dtype == np.float32  # a float n
    cases = {
        "1 arrays declared, expected 2": {"w": np.ones((2, 3), np.float32)},
        "'n' where 'w' was expected": {"n": np.ones(()), "w": np.ones((2, 3))},
        r"shape \(3, 2\), expected \(2, 3\)": {"w": np.ones((3, 2)), "n": np.ones(())},
        "is integer, expected float": {
            "w": np.ones((2, 3), np.int64),
            "n": np.ones((), np.int64),
        },
    }
    for match, arrays in cases.items():
        with pytest.raises(WeightsSpecError, match=match):
            arrays_from_bytes(arrays_to_bytes(arrays), template)


def test_without_a_spec_counts_and_dimensions_are_still_bounded() -> None:
    many = {f"a{i}": np.zeros(0, np.float32) for i in range(5)}
    with pytest.raises(WeightsFormatError, match="more than 4"):
        arrays_from_bytes(arrays_to_bytes(many), max_arrays=4)
    assert len(arrays_from_bytes(arrays_to_bytes(many), max_arrays=5)) == 5
    deep = bytearray(arrays_to_bytes({"a": np.zeros(1, np.float32)}))
    deep[12 + 2 + 1] = 33  # ndim of "a"
    with pytest.raises(WeightsFormatError, match="dimensions"):
        arrays_from_bytes(bytes(deep))
    claimed = bytearray(arrays_to_bytes({"a": np.zeros(1, np.float32)}))
    claimed[8:12] = (1000).to_bytes(4, "little")  # 1000 entries in 23 bytes
    with pytest.raises(WeightsFormatError, match="1000 arrays declared in"):
        arrays_from_bytes(bytes(claimed))
