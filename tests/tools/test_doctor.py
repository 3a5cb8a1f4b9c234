"""`ursa doctor`'s checks on injected facts, and its probes on a real Mosquitto."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.mqtt_config import MqttConfig
from ursa.tools.broker.mosquitto import MosquittoBroker, free_port
from ursa.tools.broker.tls import make_tls_files
from ursa.tools.doctor import (
    NOT_BEFORE,
    BrokerFacts,
    CheckStatus,
    HostFacts,
    ModuleFacts,
    Needs,
    blocking_reason,
    check_broker,
    check_clock,
    check_extra,
    check_machine,
    check_memory,
    check_python,
    check_torch_build,
    findings_json,
    gather_host_facts,
    probe_broker,
    run_checks,
)

MiB = 2**20
ALL_MODULES = {
    "torch": ModuleFacts("torch", "2.10.0", import_s=2.0),
    "onnx": ModuleFacts("onnx", "1.19.0", import_s=0.5),
    "onnxruntime": ModuleFacts("onnxruntime", "1.32.0", import_s=0.4),
    "tenseal": ModuleFacts("tenseal", "0.3.18", import_s=0.2),
}


def host_facts(**changes: object) -> HostFacts:
    """A healthy Raspberry Pi OS bookworm device with every extra."""
    base = HostFacts(
        python=(3, 11, 2),
        implementation="CPython",
        machine="aarch64",
        system="Linux",
        mem_total_bytes=4096 * MiB,
        mem_available_bytes=3000 * MiB,
        has_cuda_device=False,
        modules=ALL_MODULES,
        now=datetime(2027, 1, 1, tzinfo=timezone.utc),
        ntp_synchronized=True,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def without(*names: str) -> dict[str, ModuleFacts]:
    return {k: v for k, v in ALL_MODULES.items() if k not in names}


# -- pure checks ------------------------------------------------------------------


def test_python_below_310_blocks_and_above_313_warns() -> None:
    assert check_python(host_facts(python=(3, 9, 18))).status is CheckStatus.FAIL
    assert check_python(host_facts(python=(3, 10, 12))).status is CheckStatus.OK
    assert check_python(host_facts(python=(3, 13, 5))).status is CheckStatus.OK
    assert check_python(host_facts(python=(3, 14, 0))).status is CheckStatus.WARN


def test_32_bit_arm_is_not_a_checked_machine() -> None:
    assert check_machine(host_facts(machine="aarch64")).status is CheckStatus.OK
    assert check_machine(host_facts(machine="x86_64")).status is CheckStatus.OK
    finding = check_machine(host_facts(machine="armv7l"))
    assert finding.status is CheckStatus.WARN
    assert "not a checked platform" in finding.summary


def test_memory_floor_is_higher_for_a_training_device() -> None:
    selection_only = host_facts(mem_available_bytes=500 * MiB, modules=without("torch"))
    assert check_memory(selection_only, Needs()).status is CheckStatus.OK
    assert check_memory(selection_only, Needs(trains=True)).status is CheckStatus.WARN
    with_torch = host_facts(mem_available_bytes=500 * MiB)
    assert check_memory(with_torch, Needs()).status is CheckStatus.WARN
    low = host_facts(mem_available_bytes=100 * MiB, modules=without("torch"))
    assert check_memory(low, Needs()).status is CheckStatus.WARN
    unknown = host_facts(mem_available_bytes=None, mem_total_bytes=None)
    assert check_memory(unknown, Needs()).status is CheckStatus.INFO


def test_installed_extras_are_ok_with_versions_and_import_times() -> None:
    finding = check_extra(host_facts(), Needs(), "train")
    assert finding.status is CheckStatus.OK
    assert finding.summary == (
        "torch 2.10.0, imports in 2.0 s, onnx 1.19.0, imports in 0.5 s"
    )


def test_a_missing_extra_is_info_unless_the_config_needs_it() -> None:
    host = host_facts(modules=without("torch"))
    info = check_extra(host, Needs(), "train")
    assert info.status is CheckStatus.INFO
    assert "pip install 'ursa-fl[train]'" in info.summary
    fail = check_extra(host, Needs(trains=True), "train")
    assert fail.status is CheckStatus.FAIL
    assert "the config needs it: torch missing" in fail.summary


def test_an_extra_that_fails_to_import_warns_or_blocks() -> None:
    broken = dict(ALL_MODULES)
    broken["onnxruntime"] = ModuleFacts(
        "onnxruntime", "1.32.0", import_error="the interpreter died (signal 4)"
    )
    finding = check_extra(host_facts(modules=broken), Needs(), "infer")
    assert finding.status is CheckStatus.WARN
    assert "signal 4" in finding.summary
    broken["tenseal"] = ModuleFacts("tenseal", "0.3.18", import_error="ImportError: x")
    ckks = check_extra(host_facts(modules=broken), Needs(ckks=True), "ckks")
    assert ckks.status is CheckStatus.FAIL


def test_ckks_on_python_310_says_why_and_blocks_only_flicker() -> None:
    host = host_facts(python=(3, 10, 12), modules=without("tenseal"))
    finding = check_extra(host, Needs(), "ckks")
    assert finding.status is CheckStatus.INFO
    assert finding.summary.startswith(
        "CKKS unavailable: install ursa-fl[ckks] on Python ≥ 3.11"
    )
    assert check_extra(host, Needs(ckks=True), "ckks").status is CheckStatus.FAIL


def test_cuda_torch_on_a_machine_without_cuda_warns() -> None:
    cuda_torch = dict(ALL_MODULES)
    cuda_torch["torch"] = ModuleFacts(
        "torch",
        "2.14.0",
        cuda="13.0",
        cuda_requirements=("nvidia-cublas", "nvidia-cudnn-cu13", "triton"),
    )
    finding = check_torch_build(host_facts(modules=cuda_torch))
    assert finding is not None and finding.status is CheckStatus.WARN
    assert "CUDA 13.0 build and 3 nvidia/cuda packages" in finding.summary
    on_gpu = check_torch_build(host_facts(modules=cuda_torch, has_cuda_device=True))
    assert on_gpu is not None and on_gpu.status is CheckStatus.OK


def test_cuda_build_is_recognised_from_metadata_without_an_import() -> None:
    for version in ("2.5.0+cu121", "2.5.0a0+872d972e41.nv24.08"):
        modules = dict(ALL_MODULES)
        modules["torch"] = ModuleFacts("torch", version)
        finding = check_torch_build(host_facts(modules=modules))
        assert finding is not None and finding.status is CheckStatus.WARN, version
    cpu = check_torch_build(host_facts())
    assert cpu is not None and cpu.status is CheckStatus.OK
    assert cpu.summary == "torch 2.10.0: CPU build"
    assert check_torch_build(host_facts(modules=without("torch"))) is None


def test_broker_findings_name_the_stage_that_failed() -> None:
    base = BrokerFacts("pi.lan", 8883, True, None)
    unreachable = check_broker(dataclasses.replace(base, tcp_error="timed out"))
    assert unreachable.status is CheckStatus.FAIL
    assert unreachable.summary == "mqtts://pi.lan:8883 unreachable: timed out"
    tls = check_broker(dataclasses.replace(base, tls_error="certificate not trusted"))
    assert tls.summary == "mqtts://pi.lan:8883 TLS failed: certificate not trusted"
    assert check_broker(None).status is CheckStatus.INFO


def test_anonymous_probe_refused_is_ok_and_accepted_warns() -> None:
    refused = BrokerFacts(
        "h", 1883, False, None, connack="Not authorized", connect_s=0.01
    )
    assert check_broker(refused).status is CheckStatus.OK
    accepted = dataclasses.replace(refused, connack="Success", connack_accepted=True)
    finding = check_broker(accepted)
    assert finding.status is CheckStatus.WARN
    assert "accepts anonymous clients" in finding.summary


def test_refused_login_blocks() -> None:
    facts = BrokerFacts("h", 1883, False, "dev001", connack="Not authorized")
    finding = check_broker(facts)
    assert finding.status is CheckStatus.FAIL
    assert finding.summary == "mqtt://h:1883 refused login as dev001: Not authorized"


def test_clock_says_skew_is_not_measurable_and_catches_a_clock_far_behind() -> None:
    finding = check_clock(host_facts())
    assert finding.status is CheckStatus.INFO
    assert "not measurable (MQTT carries no server time)" in finding.summary
    behind = check_clock(host_facts(now=datetime(1970, 1, 1, tzinfo=timezone.utc)))
    assert behind.status is CheckStatus.WARN
    assert "before this ursa release" in behind.summary
    assert check_clock(host_facts(now=NOT_BEFORE)).status is CheckStatus.INFO


def test_blocking_reason_is_the_first_failure_on_one_line() -> None:
    host = host_facts(python=(3, 9, 1))
    broker = BrokerFacts("h", 1883, False, None, tcp_error="Connection refused")
    findings = run_checks(host, Needs(), broker)
    reason = blocking_reason(findings)
    assert reason == "python: 3.9.1 (CPython): ursa needs Python >= 3.10"
    assert "\n" not in reason
    assert blocking_reason(run_checks(host_facts(), Needs(), None)) is None


def test_warnings_do_not_block() -> None:
    host = host_facts(machine="armv7l", mem_available_bytes=10 * MiB)
    findings = run_checks(host, Needs(), None)
    assert any(f.status is CheckStatus.WARN for f in findings)
    assert blocking_reason(findings) is None


def test_json_carries_verdict_checks_and_facts() -> None:
    broker = BrokerFacts("h", 1883, False, None, tcp_error="Connection refused")
    findings = run_checks(host_facts(), Needs(), broker)
    data = json.loads(findings_json(findings, host_facts(), broker))
    assert data["ok"] is False
    assert data["reason"].startswith("broker: mqtt://h:1883 unreachable")
    assert {c["check"] for c in data["checks"]} >= {"python", "[ckks]", "clock"}
    assert data["host"]["machine"] == "aarch64"
    assert data["broker"]["tcp_error"] == "Connection refused"


def test_gathered_facts_describe_this_interpreter() -> None:
    facts = gather_host_facts(import_modules=False)
    assert facts.python[:2] >= (3, 10)
    assert facts.machine
    assert set(facts.modules) == {"torch", "onnx", "onnxruntime", "tenseal"}


# -- probes against a real Mosquitto ------------------------------------------------


@pytest.mark.integration
def test_anonymous_probe_reaches_the_broker(mosquitto: MosquittoBroker) -> None:
    facts = probe_broker(mosquitto.mqtt_config("dev001"), login=False)
    assert facts.tcp_error is None and facts.mqtt_error is None
    assert facts.connack == "Not authorized"
    assert check_broker(facts).status is CheckStatus.OK


@pytest.mark.integration
def test_probes_leave_no_socket_open(mosquitto: MosquittoBroker) -> None:
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc/self/fd")
    config = mosquitto.mqtt_config("dev003")
    before = len(list(fds.iterdir()))
    for login in (False, True):
        probe_broker(config, login=login)
    assert len(list(fds.iterdir())) == before


@pytest.mark.integration
def test_login_probe_checks_the_password(mosquitto: MosquittoBroker) -> None:
    config = mosquitto.mqtt_config("dev002")
    good = probe_broker(config, login=True)
    assert good.connack_accepted, good
    assert check_broker(good).status is CheckStatus.OK
    wrong = config.model_copy(update={"password": None})
    refused = probe_broker(wrong, login=True)
    assert check_broker(refused).status is CheckStatus.FAIL


@pytest.mark.integration
def test_nothing_listening_is_unreachable() -> None:
    facts = probe_broker(
        MqttConfig(port=free_port(), client_id="x", timeout_s=2.0), login=False
    )
    finding = check_broker(facts)
    assert finding.status is CheckStatus.FAIL
    assert "unreachable: Connection refused" in finding.summary


@pytest.mark.integration
def test_tls_broker_is_verified_against_its_ca(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory(devices=["d1"], tls=True)
    config = broker.mqtt_config("d1")
    good = probe_broker(config, login=True)
    assert good.tls_version is not None and good.connack_accepted, good
    assert "verified" in check_broker(good).summary

    # Another CA: the handshake must fail on the certificate.
    other_ca, _, _ = make_tls_files(tmp_path / "other")
    wrong_ca = probe_broker(
        config.model_copy(update={"tls_ca_file": other_ca}), login=False
    )
    assert wrong_ca.tls_error is not None
    assert "certificate not trusted" in wrong_ca.tls_error
    plain = probe_broker(
        config.model_copy(update={"tls": False, "tls_ca_file": None, "timeout_s": 2.0}),
        login=False,
    )
    finding = check_broker(plain)
    assert finding.status is CheckStatus.FAIL
    assert "(a TLS listener? use mqtts:// or --tls)" in finding.summary


@pytest.mark.integration
def test_login_probe_leaves_the_devices_queued_messages(
    mosquitto_factory: Callable[..., MosquittoBroker],
    connect_mqtt: Callable[..., MqttTransport],
) -> None:
    broker = mosquitto_factory(devices=["d1"])
    topic = "ursa/v1/f/dev/d1/down/cmd"
    connect_mqtt(broker, "d1", subscriptions=[topic]).close()
    coordinator = connect_mqtt(broker, "coordinator")
    coordinator.publish(topic, b"still queued", qos=1)
    coordinator.flush(5.0)

    probe = probe_broker(broker.mqtt_config("d1"), login=True)

    assert probe.connack_accepted, probe
    got: list[bytes] = []
    arrived = threading.Event()

    def keep(topic: str, payload: bytes) -> None:
        got.append(payload)
        arrived.set()

    connect_mqtt(broker, "d1", handler=keep)
    assert arrived.wait(5.0), broker.read_log()
    assert got == [b"still queued"]
