"""The coordinator's CKKS key, kept in its state dir like its signing key.

FLICKER's trust model gives the coordinator the CKKS secret key (the FLICKER paper;
the Paillier secret key of Dubhe and CLIMB still never reaches it). A
restarted coordinator must decrypt the ring's and the devices' ciphertexts
of the run it resumes, so the key is a file, ``<state_dir>/ckks.key``, with
the protection of ``identity.key``: created atomically with mode 0600,
refused on load when group or others may read it or when it is a symlink.
The file holds a JSON header (the `CkksParams`) and the serialized context.
"""

from __future__ import annotations

import json
from pathlib import Path

from ursa.crypto.ckks import CkksKeyOwner, CkksParams
from ursa.crypto.errors import CryptoError
from ursa.crypto.secret_file import (
    MAX_SECRET_FILE_BYTES,
    read_secret_file,
    write_new_secret_file,
)

__all__ = ["CKKS_KEY_FILENAME", "load_or_create_key_owner"]

CKKS_KEY_FILENAME = "ckks.key"
_VERSION = 1


def load_or_create_key_owner(
    state_dir: Path, params: CkksParams | None = None
) -> CkksKeyOwner:
    """Load ``state_dir/ckks.key``, or create it (mode 0600) on first use.

    Raises:
        CryptoError: the file is group/world accessible, a symlink or corrupt.
    """
    path = Path(state_dir) / CKKS_KEY_FILENAME
    if path.exists() or path.is_symlink():
        return _load(path)
    Path(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = CkksKeyOwner(params)
    if not write_new_secret_file(path, _file_bytes(owner)):
        return _load(path)  # another process won the race
    return owner


def _file_bytes(owner: CkksKeyOwner) -> bytes:
    params = owner.params
    header = {
        "version": _VERSION,
        "poly_modulus_degree": params.poly_modulus_degree,
        "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes),
        "scale_bits": params.scale_bits,
    }
    return json.dumps(header).encode("ascii") + b"\n" + owner.secret_context_bytes()


def _load(path: Path) -> CkksKeyOwner:
    data = read_secret_file(path, "CKKS key", MAX_SECRET_FILE_BYTES)
    header, _, context = data.partition(b"\n")
    try:
        record = json.loads(header)
        if record["version"] != _VERSION:
            raise ValueError(f"unknown version {record['version']}")
        params = CkksParams(
            poly_modulus_degree=int(record["poly_modulus_degree"]),
            coeff_mod_bit_sizes=tuple(int(b) for b in record["coeff_mod_bit_sizes"]),
            scale_bits=int(record["scale_bits"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CryptoError(f"corrupt CKKS key file {path}: {exc}") from exc
    return CkksKeyOwner.from_secret_context_bytes(context, params)
