"""Model weights as ordered numpy arrays: bytes codec and aggregation arithmetic.

A model's weights are an ordered ``dict[str, ndarray]`` (parameter name -> array,
in ``state_dict`` order). This module needs numpy only: the
coordinator aggregates with it and an inference-only device decodes with it,
neither of which has torch.

Wire format (all integers little-endian)::

    header   b"URSW" | version u8 | dtype u8 (1 = float32, 2 = float16)
             | reserved u16 (0) | array count u32
    entries  per array: name length u16 | UTF-8 name | [v2: kind u8]
             | ndim u8 | ndim x u32 dims
    data     per array, in entry order: the values, little-endian, C order

Version 1 holds float arrays only, all in the header's dtype. Version 2 adds
a kind byte per entry (1 = float, in the header's dtype; 3 = int64) so a
model's integer buffers (BatchNorm's ``num_batches_tracked``) travel with
its weights; it is written only when an array is an integer one, so
float-only payloads stay version 1, byte for byte.

``float16`` halves the bytes on the wire (float arrays only); decoding always
returns ``float32`` for float arrays and ``int64`` for integer ones. Encoding
to float16 raises if a finite value would overflow (|x| > 65504).

Decoding reads the whole entry table and checks it (against the expected
arrays when the caller knows them: count, names, ndim, shapes, kinds) and
checks that the declared sizes add up to the payload's length *before* it
allocates anything, so a header that declares 80,000 arrays or a 2^64-value
shape costs microseconds, not a decode.

Errors::

    WeightsError (ValueError)
     ├── WeightsFormatError     bytes that are truncated, garbage or inconsistent
     └── WeightsMismatchError   two weight dicts whose names or shapes differ
          └── WeightsSpecError  bytes that do not describe the expected arrays
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[Any]
"""A weight array: floating point, or integer for a counter buffer."""
Arrays = dict[str, FloatArray]
ArraySpec = tuple[tuple[str, tuple[int, ...]], ...]
WireDtype = Literal["float32", "float16"]

MAGIC = b"URSW"
FORMAT_VERSION = 1
"""The version written for float-only payloads (`MIXED_FORMAT_VERSION` else)."""
MIXED_FORMAT_VERSION = 2
_KIND_FLOAT = 1
_KIND_INT64 = 3
_INT64 = np.dtype("<i8")
_WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
}
_DTYPE_CODES = {"float32": 1, "float16": 2}
_CODE_DTYPES = {code: name for name, code in _DTYPE_CODES.items()}
_HEADER = struct.Struct("<4sBBHI")
_MAX_NDIM = 32
_MIN_ENTRY_BYTES = 3
"""An entry's least size: name length u16 (an empty name) and ndim u8."""
MAX_ARRAYS = 16_384
"""Arrays a payload may declare when no expected spec is given (a ResNet-152's
state dict has ~900 entries; a large transformer's a few thousand)."""


WEIGHTS_FILENAME = "model.ursw"
"""The weights file's name in a final-model folder (device and coordinator)."""


class WeightsError(ValueError):
    """Base of every error raised by `ursa.models.weights`."""


class WeightsFormatError(WeightsError):
    """Weight bytes are truncated, malformed or internally inconsistent."""


class WeightsMismatchError(WeightsError):
    """Two sets of weights do not have the same names and shapes."""


class WeightsSpecError(WeightsMismatchError):
    """Weight bytes whose header does not describe the expected arrays.

    Raised from the entry table alone, before any array is allocated.
    """


def arrays_to_bytes(
    arrays: Mapping[str, FloatArray], *, dtype: WireDtype = "float32"
) -> bytes:
    """Encode named arrays (float, or integer counters) as self-describing bytes.

    Args:
        arrays: ordered name -> floating-point or integer array.
        dtype: wire precision of the float arrays; ``"float16"`` halves the size.

    Raises:
        WeightsError: unknown dtype, a bool/complex/object array, bad name or
            shape, or a float16 overflow.
    """
    if dtype not in _WIRE_DTYPES:
        raise WeightsError(f"unknown wire dtype {dtype!r}; use float32 or float16")
    wire = _WIRE_DTYPES[dtype]
    items = [(str(name), np.asarray(array)) for name, array in arrays.items()]
    for name, arr in items:
        if arr.dtype.kind not in "fiu":
            raise WeightsError(f"array {name!r} has dtype {arr.dtype}, not float")
    mixed = any(arr.dtype.kind in "iu" for _, arr in items)
    version = MIXED_FORMAT_VERSION if mixed else FORMAT_VERSION
    entries = [_HEADER.pack(MAGIC, version, _DTYPE_CODES[dtype], 0, len(items))]
    data: list[bytes] = []
    for name, arr in items:
        encoded_name = name.encode("utf-8")
        if len(encoded_name) > 0xFFFF or arr.ndim > _MAX_NDIM:
            raise WeightsError(f"array {name!r}: name too long or too many dimensions")
        if any(d > 0xFFFFFFFF for d in arr.shape):
            raise WeightsError(f"array {name!r}: dimension too large {arr.shape}")
        is_int = arr.dtype.kind in "iu"
        if is_int and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise WeightsError(f"array {name!r} overflows int64")
        with np.errstate(over="ignore"):
            encoded = np.ascontiguousarray(
                arr, dtype=_INT64 if is_int else wire
            ).reshape(arr.shape)  # (ascontiguousarray makes a 0-d array 1-d)
        if (
            not is_int
            and dtype == "float16"
            and not np.array_equal(np.isfinite(encoded), np.isfinite(arr))
        ):
            raise WeightsError(f"array {name!r} overflows float16 (|x| > 65504)")
        entries.append(struct.pack("<H", len(encoded_name)) + encoded_name)
        if mixed:
            entries.append(struct.pack("<B", _KIND_INT64 if is_int else _KIND_FLOAT))
        entries.append(struct.pack(f"<B{arr.ndim}I", arr.ndim, *arr.shape))
        data.append(encoded.tobytes())
    return b"".join(entries + data)


def arrays_from_bytes(
    data: bytes,
    expected: Mapping[str, FloatArray] | None = None,
    *,
    max_arrays: int = MAX_ARRAYS,
) -> Arrays:
    """Decode bytes from `arrays_to_bytes`: ordered float32 (and int64) arrays.

    Args:
        data: the payload.
        expected: the arrays the payload must describe (a template: the
            global model, say): the same count, names in the same order,
            shapes, and kinds (a float array must arrive as a float one; an
            integer counter may arrive as either). None when the receiver
            cannot know them (a device's first download).
        max_arrays: the most arrays a payload may declare without ``expected``.

    Raises:
        WeightsSpecError: the header does not describe ``expected``.
        WeightsFormatError: the bytes are truncated, garbage or inconsistent.
    """
    view = memoryview(data)
    try:
        magic, version, code, _, count = _HEADER.unpack_from(view, 0)
    except struct.error as exc:
        raise WeightsFormatError("weights bytes shorter than the header") from exc
    if magic != MAGIC:
        raise WeightsFormatError("not a weights payload (bad magic)")
    if version not in (FORMAT_VERSION, MIXED_FORMAT_VERSION):
        raise WeightsFormatError(f"unsupported weights format version {version}")
    if code not in _CODE_DTYPES:
        raise WeightsFormatError(f"unknown wire dtype code {code}")
    template = None if expected is None else _template(expected)
    if template is not None and count != len(template):
        raise WeightsSpecError(f"{count} arrays declared, expected {len(template)}")
    if template is None and count > max_arrays:
        raise WeightsFormatError(f"{count} arrays declared, more than {max_arrays}")
    if count * _MIN_ENTRY_BYTES > len(view) - _HEADER.size:
        raise WeightsFormatError(f"{count} arrays declared in {len(view)} bytes")
    entries = _entries(view, version, _WIRE_DTYPES[_CODE_DTYPES[code]], count)
    offset, table = entries
    if template is not None:
        _check_spec(table, template)
    sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape in table]
    held = len(view) - offset
    declared = sum(sizes)
    if declared > held:
        raise WeightsFormatError(
            f"weights bytes truncated: entries declare {declared} data bytes, "
            f"the payload holds {held}"
        )
    if declared < held:
        raise WeightsFormatError(f"{held - declared} unexpected trailing bytes")
    out: Arrays = {}
    for (name, array_dtype, shape), size in zip(table, sizes, strict=True):
        if name in out:
            raise WeightsFormatError(f"duplicate array name {name!r}")
        out[name] = _decode_array(view, offset, array_dtype, shape)
        offset += size
    return out


_Entry = tuple[str, np.dtype[Any], tuple[int, ...]]


def _entries(
    view: memoryview, version: int, wire: np.dtype[Any], count: int
) -> tuple[int, list[_Entry]]:
    """The entry table (name, dtype on the wire, shape) and where the data starts."""
    offset = _HEADER.size
    entries: list[_Entry] = []
    try:
        for _ in range(count):
            (name_len,) = struct.unpack_from("<H", view, offset)
            raw_name = bytes(view[offset + 2 : offset + 2 + name_len])
            if len(raw_name) != name_len:
                raise WeightsFormatError("weights bytes truncated inside a name")
            offset += 2 + name_len
            kind = _KIND_FLOAT
            if version == MIXED_FORMAT_VERSION:
                (kind,) = struct.unpack_from("<B", view, offset)
                offset += 1
            if kind not in (_KIND_FLOAT, _KIND_INT64):
                raise WeightsFormatError(f"unknown array kind {kind}")
            (ndim,) = struct.unpack_from("<B", view, offset)
            if ndim > _MAX_NDIM:
                raise WeightsFormatError(f"{ndim} dimensions, more than {_MAX_NDIM}")
            shape = struct.unpack_from(f"<{ndim}I", view, offset + 1)
            offset += 1 + 4 * ndim
            array_dtype = _INT64 if kind == _KIND_INT64 else wire
            entries.append((raw_name.decode("utf-8"), array_dtype, tuple(shape)))
    except struct.error as exc:
        raise WeightsFormatError("weights bytes truncated in the entry table") from exc
    except UnicodeDecodeError as exc:
        raise WeightsFormatError("array name is not valid UTF-8") from exc
    return offset, entries


def _template(
    expected: Mapping[str, FloatArray],
) -> list[tuple[str, bool, tuple[int, ...]]]:
    """(name, is an integer array, shape) of each expected array, in order."""
    return [
        (name, np.asarray(a).dtype.kind in "iu", tuple(np.shape(a)))
        for name, a in expected.items()
    ]


def _check_spec(
    table: list[_Entry], template: list[tuple[str, bool, tuple[int, ...]]]
) -> None:
    for (name, dtype, shape), (want, is_int, want_shape) in zip(
        table, template, strict=True
    ):
        if name != want:
            raise WeightsSpecError(f"array {name!r} where {want!r} was expected")
        if shape != want_shape:
            raise WeightsSpecError(
                f"array {name!r}: shape {shape}, expected {want_shape}"
            )
        if dtype.kind == "i" and not is_int:
            raise WeightsSpecError(f"array {name!r} is integer, expected float")


def _decode_array(
    view: memoryview, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]
) -> FloatArray:
    count = math.prod(shape)
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    native = np.int64 if dtype.kind == "i" else np.float32
    return flat.astype(native).reshape(shape)


def spec_of(arrays: Mapping[str, FloatArray]) -> ArraySpec:
    """Return the ordered (name, shape) pairs that describe ``arrays``."""
    return tuple((name, tuple(np.shape(a))) for name, a in arrays.items())


def flatten(arrays: Mapping[str, FloatArray]) -> tuple[FloatArray, ArraySpec]:
    """Concatenate all arrays (in order) into one 1-D vector plus its spec.

    The vector has the arrays' common result dtype (float32 for model weights).
    """
    spec = spec_of(arrays)
    if not arrays:
        return np.zeros(0, dtype=np.float32), spec
    vector = np.concatenate([np.ravel(a) for a in arrays.values()])
    return vector, spec


def unflatten(vector: FloatArray, spec: ArraySpec) -> Arrays:
    """Split a flat vector back into named arrays following ``spec``.

    Raises:
        WeightsMismatchError: the vector length does not match the spec.
    """
    flat = np.asarray(vector)
    total = sum(int(np.prod(shape, dtype=np.int64)) for _, shape in spec)
    if flat.ndim != 1 or flat.size != total:
        raise WeightsMismatchError(
            f"vector of shape {flat.shape} does not fit a spec of {total} values"
        )
    out: Arrays = {}
    offset = 0
    for name, shape in spec:
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = flat[offset : offset + size].reshape(shape).copy()
        offset += size
    return out


def check_compatible(a: Mapping[str, FloatArray], b: Mapping[str, FloatArray]) -> None:
    """Raise `WeightsMismatchError` unless ``a`` and ``b`` have equal names/shapes."""
    if a.keys() != b.keys():
        missing = sorted(set(a) ^ set(b))
        raise WeightsMismatchError(f"array names differ: {missing}")
    for name, arr in a.items():
        if np.shape(arr) != np.shape(b[name]):
            raise WeightsMismatchError(
                f"array {name!r}: shape {np.shape(arr)} vs {np.shape(b[name])}"
            )


def zeros_like(
    arrays: Mapping[str, FloatArray], *, dtype: npt.DTypeLike | None = None
) -> Arrays:
    """Return zero arrays with the same names and shapes (dtype kept unless given)."""
    return {name: np.zeros_like(a, dtype=dtype) for name, a in arrays.items()}


def subtract(a: Mapping[str, FloatArray], b: Mapping[str, FloatArray]) -> Arrays:
    """Return ``a - b`` name by name (e.g. local weights minus global weights)."""
    check_compatible(a, b)
    return {name: np.subtract(arr, b[name]) for name, arr in a.items()}


def add_scaled(
    base: Mapping[str, FloatArray], other: Mapping[str, FloatArray], scale: float
) -> Arrays:
    """Return ``base + scale * other`` name by name, in ``base``'s dtypes."""
    check_compatible(base, other)
    return {
        name: (arr + scale * np.asarray(other[name], dtype=np.float64)).astype(
            arr.dtype, copy=False
        )
        for name, arr in base.items()
    }


def accumulate_scaled(
    acc: Mapping[str, FloatArray], other: Mapping[str, FloatArray], scale: float
) -> None:
    """Add ``scale * other`` into ``acc`` in place (running weighted sums).

    Use a float64 accumulator (``zeros_like(w, dtype=np.float64)``) so that
    summing many float32 updates does not lose precision.
    """
    check_compatible(acc, other)
    for name, arr in acc.items():
        arr += scale * np.asarray(other[name], dtype=np.float64)


def num_values(arrays: Mapping[str, FloatArray]) -> int:
    """Return the total number of scalar values (parameters) in ``arrays``."""
    return sum(int(np.size(a)) for a in arrays.values())
