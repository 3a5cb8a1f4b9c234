"""`ursa doctor`: what a field install needs, as pure checks over gathered facts.

The checks (`run_checks`) are pure functions from facts to `Finding`s; the
facts come from two probes at the edge: `gather_host_facts` (the interpreter,
the machine, memory, installed extras, each imported in a subprocess so that
a broken wheel cannot crash the doctor) and `probe_broker` (TCP, the TLS
handshake, then an MQTT CONNECT with paho).

The broker probe connects anonymously unless asked to log in: an anonymous
CONNECT that the broker refuses with "not authorized" still proves the
address, the TLS chain and the MQTT listener. Logging in uses the device's
own client id (Mosquitto forces client id = username), so it takes over that
client's session for a moment: a running device is disconnected and
reconnects. Messages queued for the device survive, because the probe
subscribes to nothing and acknowledges nothing (paho's manual acks), so the
broker redelivers them to the device.

Clock skew against the broker cannot be measured: MQTT carries no server
time, and the ``sent_at`` of ursa messages is the sender's clock (retained ones
are old). The doctor says so, reports whether systemd-timesyncd has
synchronized this machine's clock, and warns when the clock reads earlier
than this release was made (a Raspberry Pi has no real-time clock: until NTP
answers, TLS certificates look "not yet valid").
"""

from __future__ import annotations

import json
import platform
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

from ursa._compat import StrEnum
from ursa.protocol.mqtt_config import MqttConfig, TlsContext

__all__ = [
    "EXTRAS",
    "BrokerFacts",
    "CheckStatus",
    "Finding",
    "HostFacts",
    "ModuleFacts",
    "Needs",
    "blocking_reason",
    "gather_host_facts",
    "probe_broker",
    "run_checks",
]

MIN_PYTHON = (3, 10)
MAX_TESTED_PYTHON = (3, 13)
LOW_MEMORY_BYTES = 256 * 1024 * 1024
"""Below this much available memory a selection-only device is at risk."""
LOW_MEMORY_TRAINING_BYTES = 768 * 1024 * 1024
"""A training device: importing torch alone takes ~240 MiB (docs/install.md)."""
NOT_BEFORE = datetime(2026, 11, 26, tzinfo=timezone.utc)
"""This check was written then: a clock that reads earlier is certainly wrong."""
IMPORT_TIMEOUT_S = 300.0
"""Importing torch under emulation or on a Pi Zero takes tens of seconds."""
CHECKED_MACHINES = ("x86_64", "aarch64", "arm64", "AMD64")

EXTRAS: Mapping[str, tuple[str, ...]] = {
    "train": ("torch", "onnx"),
    "infer": ("onnxruntime",),
    "ckks": ("tenseal",),
}
"""Each extra and the modules it brings (import names)."""
_DISTRIBUTIONS: Mapping[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tenseal": ("tenseal",),
}
_CUDA_DEVICE_FILES = (
    "/dev/nvidia0",  # a discrete NVIDIA GPU with its driver
    "/proc/driver/nvidia/version",
    "/etc/nv_tegra_release",  # a Jetson (L4T)
)
_TIMESYNC_FLAG = "/run/systemd/timesync/synchronized"


class CheckStatus(StrEnum):
    """How a check came out; only FAIL makes `ursa doctor` exit non-zero."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    """One check's outcome: a status and a one-line summary."""

    check: str
    status: CheckStatus
    summary: str


@dataclass(frozen=True)
class ModuleFacts:
    """An optional module: its installed version and how importing it went."""

    name: str
    version: str | None = None
    """The distribution's version; None: not installed."""
    import_error: str | None = None
    import_s: float | None = None
    cuda: str | None = None
    """torch only: ``torch.version.cuda`` (None: a CPU build, or not imported)."""
    cuda_requirements: tuple[str, ...] = ()
    """torch only: installed nvidia-* / cuda-* distributions torch requires."""

    @property
    def is_installed(self) -> bool:
        """True when the distribution is installed."""
        return self.version is not None

    @property
    def is_usable(self) -> bool:
        """True when installed and it imported (or was not tried)."""
        return self.is_installed and self.import_error is None


@dataclass(frozen=True)
class HostFacts:
    """What the doctor learns about this machine and interpreter."""

    python: tuple[int, int, int]
    implementation: str
    machine: str
    system: str
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    has_cuda_device: bool
    modules: Mapping[str, ModuleFacts]
    now: datetime
    ntp_synchronized: bool | None
    """systemd-timesyncd's flag; None: this machine does not say."""


@dataclass(frozen=True)
class Needs:
    """What the device's config asks for (all False without a config)."""

    trains: bool = False
    ckks: bool = False


@dataclass(frozen=True)
class BrokerFacts:
    """How far a connection to the broker got (the first error ends the probe)."""

    host: str
    port: int
    tls: bool
    login: str | None
    """The user the probe logged in as; None: an anonymous probe."""
    tcp_error: str | None = None
    tls_error: str | None = None
    connack: str | None = None
    """The broker's CONNACK reason ("Success", "Not authorized", ...)."""
    connack_accepted: bool = False
    mqtt_error: str | None = None
    connect_s: float | None = None
    tls_version: str | None = None

    @property
    def address(self) -> str:
        """``mqtt[s]://host:port``."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


# -- pure checks ----------------------------------------------------------------


def check_python(host: HostFacts) -> Finding:
    """Python 3.10 to 3.13 is supported; older blocks, newer is untested."""
    version = ".".join(map(str, host.python))
    label = f"{version} ({host.implementation})"
    if host.python[:2] < MIN_PYTHON:
        return Finding(
            "python", CheckStatus.FAIL, f"{label}: ursa needs Python >= 3.10"
        )
    if host.python[:2] > MAX_TESTED_PYTHON:
        return Finding(
            "python", CheckStatus.WARN, f"{label}: newer than 3.13, untested"
        )
    return Finding("python", CheckStatus.OK, label)


def check_machine(host: HostFacts) -> Finding:
    """64-bit x86 and ARM are checked; 32-bit ARM (armv7l, Pi OS 32-bit) is not."""
    label = f"{host.machine} {host.system}"
    if host.machine not in CHECKED_MACHINES:
        return Finding(
            "machine",
            CheckStatus.WARN,
            f"{label}: not a checked platform (64-bit Linux on x86_64 or aarch64)",
        )
    return Finding("machine", CheckStatus.OK, label)


def check_memory(host: HostFacts, needs: Needs) -> Finding:
    """Warn when available memory is low for the device's job."""
    if host.mem_available_bytes is None:
        return Finding("memory", CheckStatus.INFO, "available memory unknown")
    trains = needs.trains or host.modules.get("torch", ModuleFacts("torch")).is_usable
    floor = LOW_MEMORY_TRAINING_BYTES if trains else LOW_MEMORY_BYTES
    total = "" if host.mem_total_bytes is None else f" of {_mib(host.mem_total_bytes)}"
    summary = f"{_mib(host.mem_available_bytes)} available{total}"
    if host.mem_available_bytes < floor:
        job = "a training device" if trains else "a device"
        return Finding(
            "memory", CheckStatus.WARN, f"{summary}: below {_mib(floor)} for {job}"
        )
    return Finding("memory", CheckStatus.OK, summary)


def check_extra(host: HostFacts, needs: Needs, extra: str) -> Finding:
    """One extra (``train``, ``infer`` or ``ckks``): installed, importable, needed."""
    check = f"[{extra}]"
    install = f"pip install 'ursa-fl[{extra}]'"
    needed = (extra == "train" and needs.trains) or (extra == "ckks" and needs.ckks)
    if extra == "ckks" and host.python[:2] < (3, 11):
        from ursa.crypto.ckks import CKKS_UNAVAILABLE

        status = CheckStatus.FAIL if needed else CheckStatus.INFO
        reason = f"{CKKS_UNAVAILABLE} (TenSEAL has no cp310 wheel)"
        return Finding(check, status, reason)
    modules = [host.modules.get(name, ModuleFacts(name)) for name in EXTRAS[extra]]
    missing = [m.name for m in modules if not m.is_installed]
    broken = [m for m in modules if m.is_installed and m.import_error is not None]
    if broken:
        errors = "; ".join(f"{m.name} {m.version}: {m.import_error}" for m in broken)
        return Finding(
            check,
            CheckStatus.FAIL if needed else CheckStatus.WARN,
            f"import fails: {errors}",
        )
    if missing:
        what = "the config needs it" if needed else "not installed"
        return Finding(
            check,
            CheckStatus.FAIL if needed else CheckStatus.INFO,
            f"{what}: {', '.join(missing)} missing ({install})",
        )
    return Finding(check, CheckStatus.OK, ", ".join(_describe(m) for m in modules))


def check_torch_build(host: HostFacts) -> Finding | None:
    """Warn about a CUDA build of torch on a machine without CUDA (the CUDA trap)."""
    torch = host.modules.get("torch")
    if torch is None or not torch.is_installed:
        return None
    cuda_build = (
        torch.cuda is not None
        or bool(torch.cuda_requirements)
        or any(tag in (torch.version or "") for tag in ("+cu", ".nv"))
    )
    if not cuda_build:
        return Finding(
            "torch build", CheckStatus.OK, f"torch {torch.version}: CPU build"
        )
    cuda = f"CUDA {torch.cuda}" if torch.cuda else "CUDA"
    if host.has_cuda_device:
        return Finding(
            "torch build",
            CheckStatus.OK,
            f"torch {torch.version}: {cuda} build, GPU found",
        )
    extra = len(torch.cuda_requirements)
    libraries = f" and {extra} nvidia/cuda packages" if extra else ""
    return Finding(
        "torch build",
        CheckStatus.WARN,
        f"torch {torch.version} is a {cuda} build{libraries} on a machine without "
        "CUDA: reinstall the CPU build (see docs/install.md)",
    )


def check_broker(broker: BrokerFacts | None) -> Finding:
    """The broker must be reachable, over TLS when configured, and speak MQTT."""
    if broker is None:
        return Finding(
            "broker",
            CheckStatus.INFO,
            "not checked (give --config device.toml or --host)",
        )
    where = broker.address
    for stage, error in (
        ("unreachable", broker.tcp_error),
        ("TLS failed", broker.tls_error),
        ("MQTT failed", broker.mqtt_error),
    ):
        if error is not None:
            hint = ""
            if stage == "MQTT failed" and not broker.tls and "CONNACK" in error:
                hint = " (a TLS listener? use mqtts:// or --tls)"
            return Finding(
                "broker", CheckStatus.FAIL, f"{where} {stage}: {error}{hint}"
            )
    tls = f", {broker.tls_version} verified" if broker.tls else ""
    took = "" if broker.connect_s is None else f" in {broker.connect_s * 1000:.0f} ms"
    if broker.login is not None:
        if not broker.connack_accepted:
            return Finding(
                "broker",
                CheckStatus.FAIL,
                f"{where} refused login as {broker.login}: {broker.connack}",
            )
        return Finding(
            "broker", CheckStatus.OK, f"{where}: logged in as {broker.login}{took}{tls}"
        )
    if broker.connack_accepted:
        return Finding(
            "broker",
            CheckStatus.WARN,
            f"{where} reachable{tls}, but it accepts anonymous clients "
            "(ursa's Mosquitto config sets allow_anonymous false)",
        )
    return Finding(
        "broker",
        CheckStatus.OK,
        f"{where} reachable{took}{tls}; answered an anonymous probe with "
        f"{broker.connack!r} (--login checks the credentials)",
    )


def check_clock(host: HostFacts) -> Finding:
    """Say that skew against the broker is not measurable; catch a clock far behind."""
    skew = "skew against the broker not measurable (MQTT carries no server time)"
    if host.now < NOT_BEFORE:
        return Finding(
            "clock",
            CheckStatus.WARN,
            f"reads {host.now:%Y-%m-%d %H:%M} UTC, before this ursa release: set the "
            "time (TLS certificates look not yet valid); " + skew,
        )
    sync = {
        True: "NTP-synchronized (systemd-timesyncd)",
        False: "not NTP-synchronized by systemd-timesyncd",
        None: "NTP state unknown",
    }[host.ntp_synchronized]
    return Finding("clock", CheckStatus.INFO, f"{sync}; {skew}")


def run_checks(
    host: HostFacts, needs: Needs, broker: BrokerFacts | None
) -> list[Finding]:
    """Every check, in the order `ursa doctor` prints them."""
    findings = [check_python(host), check_machine(host), check_memory(host, needs)]
    findings += [check_extra(host, needs, extra) for extra in EXTRAS]
    torch = check_torch_build(host)
    if torch is not None:
        findings.append(torch)
    findings += [check_broker(broker), check_clock(host)]
    return findings


def blocking_reason(findings: Sequence[Finding]) -> str | None:
    """The first failure as one line (``check: summary``), or None."""
    for finding in findings:
        if finding.status is CheckStatus.FAIL:
            return f"{finding.check}: {finding.summary}"
    return None


def findings_json(
    findings: Sequence[Finding], host: HostFacts, broker: BrokerFacts | None
) -> str:
    """One JSON object: ``ok``, ``reason``, the findings and the raw facts."""
    facts = asdict(host)
    facts["now"] = host.now.isoformat()
    return json.dumps(
        {
            "ok": blocking_reason(findings) is None,
            "reason": blocking_reason(findings),
            "checks": [
                {"check": f.check, "status": str(f.status), "summary": f.summary}
                for f in findings
            ],
            "host": facts,
            "broker": None if broker is None else asdict(broker),
        }
    )


def _describe(module: ModuleFacts) -> str:
    took = "" if module.import_s is None else f", imports in {module.import_s:.1f} s"
    return f"{module.name} {module.version}{took}"


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.0f} MiB"


# -- probes (I/O) ---------------------------------------------------------------

_IMPORT_PROBE = """
import json, sys, time
start = time.perf_counter()
module = __import__(sys.argv[1])
took = time.perf_counter() - start
cuda = getattr(getattr(module, "version", None), "cuda", None)
print(json.dumps({"seconds": took, "cuda": cuda if isinstance(cuda, str) else None}))
"""


def gather_host_facts(*, import_modules: bool = True) -> HostFacts:
    """Look at this interpreter and machine (imports extras in subprocesses)."""
    total, available = _meminfo(Path("/proc/meminfo"))
    modules = {
        name: _module_facts(name, import_module=import_modules)
        for extra in EXTRAS.values()
        for name in extra
    }
    flag = Path(_TIMESYNC_FLAG)
    return HostFacts(
        python=(sys.version_info[0], sys.version_info[1], sys.version_info[2]),
        implementation=platform.python_implementation(),
        machine=platform.machine(),
        system=platform.system(),
        mem_total_bytes=total,
        mem_available_bytes=available,
        has_cuda_device=any(Path(p).exists() for p in _CUDA_DEVICE_FILES),
        modules=modules,
        now=datetime.now(timezone.utc),
        ntp_synchronized=flag.exists() if flag.parent.is_dir() else None,
    )


def _meminfo(path: Path) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo, None where absent."""
    try:
        text = path.read_text()
    except OSError:
        return None, None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024  # kB
    return values.get("MemTotal"), values.get("MemAvailable")


def _module_facts(name: str, *, import_module: bool) -> ModuleFacts:
    version = None
    for dist in _DISTRIBUTIONS[name]:
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if version is None:
        return ModuleFacts(name)
    cuda_requirements = _cuda_requirements() if name == "torch" else ()
    if not import_module:
        return ModuleFacts(name, version, cuda_requirements=cuda_requirements)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, name],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ModuleFacts(
            name,
            version,
            import_error=f"import took over {IMPORT_TIMEOUT_S:.0f} s",
            cuda_requirements=cuda_requirements,
        )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        error = lines[-1] if lines else f"exit status {done.returncode}"
        if done.returncode < 0:
            error = f"the interpreter died (signal {-done.returncode})"
        return ModuleFacts(
            name, version, import_error=error, cuda_requirements=cuda_requirements
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return ModuleFacts(
        name,
        version,
        import_s=float(result["seconds"]),
        cuda=result["cuda"],
        cuda_requirements=cuda_requirements,
    )


def _cuda_requirements() -> tuple[str, ...]:
    """Installed nvidia-* / cuda-* / triton distributions that torch requires."""
    found = []
    for requirement in metadata.requires("torch") or []:
        name = requirement.split(";")[0].split("[")[0]
        name = name.split("=")[0].split("<")[0].split(">")[0].split("!")[0].strip()
        if not name.lower().startswith(("nvidia-", "cuda-", "triton")):
            continue
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return tuple(sorted(set(found)))


@dataclass
class _Connack:
    event: threading.Event = field(default_factory=threading.Event)
    reason: ReasonCode | None = None


def probe_broker(config: MqttConfig, *, login: bool) -> BrokerFacts:
    """Try TCP, then the TLS handshake, then an MQTT CONNECT (see the module doc).

    ``login`` connects as ``config``'s user and client id (clean session off,
    manual acks, no subscriptions); otherwise an anonymous client with a
    throw-away id asks for a clean session.
    """
    user = config.username if login else None
    facts = BrokerFacts(config.host, config.port, config.tls, user)
    timeout_s = config.timeout_s
    start = time.monotonic()
    try:
        sock = socket.create_connection((config.host, config.port), timeout=timeout_s)
    except OSError as exc:
        return replace(facts, tcp_error=_os_error(exc))
    tls_version = None
    with sock:
        if config.tls:
            try:
                context = TlsContext.from_config(config)
                with context.wrap_socket(sock, server_hostname=config.host) as wrapped:
                    tls_version = wrapped.version()
            except (OSError, ssl.SSLError) as exc:
                return replace(facts, tls_error=_tls_error(exc))
    facts = replace(facts, tls_version=tls_version)
    client_id = config.client_id if login else f"ursa-doctor-{uuid.uuid4().hex[:12]}"
    return _mqtt_connect(config, facts, client_id=client_id, start=start)


def _mqtt_connect(
    config: MqttConfig, facts: BrokerFacts, *, client_id: str, start: float
) -> BrokerFacts:
    v5 = config.protocol == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=None if v5 else facts.login is None,
        protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
    )
    client.manual_ack_set(True)  # queued messages stay the device's
    if facts.login is not None:
        password = config.password.get_secret_value() if config.password else None
        client.username_pw_set(facts.login, password)
    context = TlsContext.from_config(config) if config.tls else None
    if context is not None:
        client.tls_set_context(context)
    connack = _Connack()

    def on_connect(
        client: paho.Client,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Any,
    ) -> None:
        connack.reason = reason_code
        connack.event.set()

    client.on_connect = on_connect
    try:
        client.connect(config.host, config.port, keepalive=config.keepalive_s)
    except (OSError, ValueError) as exc:
        return replace(facts, mqtt_error=_os_error(exc))
    client.loop_start()
    try:
        if not connack.event.wait(config.timeout_s):
            return replace(
                facts, mqtt_error=f"no CONNACK within {config.timeout_s:g} s"
            )
        reason = connack.reason
        assert reason is not None
        return replace(
            facts,
            connack=str(reason),
            connack_accepted=not reason.is_failure,
            connect_s=time.monotonic() - start,
        )
    finally:
        client.disconnect()
        client.loop_stop()
        if context is not None:
            context.close_last_socket()
        # paho closes its socket, and its wake-up socket pair, only in
        # reinitialise() or __del__; left to a garbage-collected cycle they
        # would be finalised unclosed (ResourceWarning).
        client.reinitialise()


def _os_error(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _tls_error(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted: {exc.verify_message}"
    if isinstance(exc, FileNotFoundError):
        return f"CA file not found: {exc.filename}"
    return _os_error(exc)
