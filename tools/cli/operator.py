r"""The operator's root of trust: `ursa operator init|certify`, run off the coordinator.

::

    ursa operator init --out ~/ursa-operator        # operator.key (0600), .pub
    ursa device identity --config device.toml       # on the device: its public line
    ursa operator certify device --key ~/ursa-operator/operator.key \
        --federation trial1 --identity <public hex> --out dev001.cert
    ursa operator certify coordinator --key ~/ursa-operator/operator.key \
        --federation trial1 --identity-file <state_dir>/coordinator.pub \
        --out coordinator.cert

Every device and the coordinator get ``operator_public_key`` and their own
``certificate`` under ``[trust]`` (`ursa.protocol.trust_config`). The
operator key signs certificates only; keep it on the operator's machine, not
the coordinator's host: whoever holds it can vouch for any keys.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ursa.crypto.certificate import Certificate, OperatorKey, Role
    from ursa.crypto.identity import DevicePublicIdentity

    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "KEY_FILENAME",
    "PUBLIC_FILENAME",
    "certify",
    "create_operator_key",
    "register",
]

KEY_FILENAME = "operator.key"
PUBLIC_FILENAME = "operator.pub"
DEFAULT_DAYS = 365


def register(sub: Subparsers) -> None:
    """Attach ``ursa operator init`` and ``ursa operator certify``."""
    operator = sub.add_parser(
        "operator", help="the operator's signing key and certificates (off-host)"
    )
    commands = operator.add_subparsers(dest="operator_command", required=True)
    init = commands.add_parser("init", help="make the operator signing key")
    init.add_argument("--out", type=Path, required=True, help="directory (0700)")
    init.set_defaults(handler=_init)
    certify_parser = commands.add_parser(
        "certify", help="sign a device's or the coordinator's identity keys"
    )
    roles = certify_parser.add_subparsers(dest="role", required=True)
    for role, source in (
        ("device", "the `public` line of `ursa device identity`"),
        ("coordinator", "the first line of <state_dir>/coordinator.pub"),
    ):
        parser = roles.add_parser(role, help=f"certify a {role} identity")
        parser.add_argument("--key", type=Path, required=True, help=KEY_FILENAME)
        parser.add_argument("--federation", required=True, help="the federation")
        subject = parser.add_mutually_exclusive_group(required=True)
        subject.add_argument("--identity", help=f"public identity hex: {source}")
        subject.add_argument(
            "--identity-file", type=Path, help="a file whose first line is that hex"
        )
        parser.add_argument(
            "--days", type=int, default=DEFAULT_DAYS, help="validity (default 365)"
        )
        parser.add_argument("--serial", type=int, help="default: random")
        parser.add_argument("--out", type=Path, required=True, help="certificate file")
        parser.set_defaults(handler=_certify)


def create_operator_key(directory: Path) -> OperatorKey:
    """A new operator key in ``directory`` (key 0600, public key beside it).

    Raises:
        FileExistsError: ``directory`` holds an operator key already.
        CryptoError: the directory cannot be made private.
    """
    from ursa.crypto.certificate import OperatorKey
    from ursa.crypto.secret_file import ensure_private_dir

    ensure_private_dir(directory, "operator")
    key = OperatorKey.generate()
    if not key.write_new(directory / KEY_FILENAME):
        raise FileExistsError(f"{directory / KEY_FILENAME} exists; not replacing it")
    public = key.public()
    (directory / PUBLIC_FILENAME).write_text(
        f"{public.hex()}\nfingerprint {public.fingerprint()}\n"
    )
    return key


def certify(
    key: OperatorKey,
    role: Role,
    subject: DevicePublicIdentity,
    *,
    federation: str,
    days: int = DEFAULT_DAYS,
    serial: int | None = None,
    now: float | None = None,
) -> Certificate:
    """``subject``'s certificate, valid from now for ``days`` days."""
    issued = int(time.time() if now is None else now)
    return key.certify(
        role,
        subject,
        federation=federation,
        serial=secrets.randbits(63) if serial is None else serial,
        issued_at=issued,
        expires_at=issued + days * 86400,
    )


def _init(args: argparse.Namespace) -> int:
    from ursa.crypto.errors import CryptoError

    try:
        public = create_operator_key(args.out).public()
    except (FileExistsError, CryptoError, OSError) as exc:
        print(f"ursa operator init: {exc}", file=sys.stderr)
        return 1
    print(f"operator public key {public.hex()}")
    print(f"fingerprint {public.fingerprint()}")
    print(
        f"on every device and the coordinator: [trust] operator_public_key = "
        f'"{public.hex()}"; keep {args.out / KEY_FILENAME} off the coordinator host'
    )
    return 0


def _certify(args: argparse.Namespace) -> int:
    from ursa.crypto.certificate import OperatorKey, Role
    from ursa.crypto.errors import CryptoError
    from ursa.crypto.identity import DevicePublicIdentity

    role = Role.DEVICE if args.role == "device" else Role.COORDINATOR
    if args.days < 1:
        print("ursa operator certify: --days must be at least 1", file=sys.stderr)
        return 2
    try:
        text = args.identity
        if text is None:
            text = Path(args.identity_file).read_text().splitlines()[0]
        subject = DevicePublicIdentity.from_bytes(bytes.fromhex(text.strip()))
        certificate = certify(
            OperatorKey.load(args.key),
            role,
            subject,
            federation=args.federation,
            days=args.days,
            serial=args.serial,
        )
        with Path(args.out).open("x", encoding="ascii") as handle:
            handle.write(certificate.to_text())
    except (CryptoError, OSError, ValueError, IndexError) as exc:
        print(f"ursa operator certify: {exc}", file=sys.stderr)
        return 1
    expires = time.strftime("%Y-%m-%d", time.gmtime(certificate.expires_at))
    print(
        f"certified {args.role} {subject.device_id} ({subject.fingerprint()}) for "
        f"federation {args.federation} until {expires}, serial {certificate.serial}"
    )
    print(f'its config: [trust] certificate = "{args.out}"')
    return 0
