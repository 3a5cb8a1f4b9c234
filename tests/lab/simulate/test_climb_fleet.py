"""The lab's `ClimbFleet`: the production `ClimbDualStep` and devices' `Climb`.

(With it the parts it is made of: `StepHost`, `HostParts`, `ClimbDevice`,
`BareDeviceLink`.)

A dual step over the in-memory bus gives every device the weight and lambda
of CLIMB's dual update on the fleet's means; a device the bus never reaches
is left out at the step's deadline; what a device or the coordinator refuses
is answered and noted, never raised.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    apply_dual_means_all,
    plain_dual_means,
)
from ursa.lab.simulate.climb_fleet import FEDERATION, ClimbFleet, device_id
from ursa.lab.simulate.methods import device_losses
from ursa.models.registry import initial_arrays
from ursa.models.weights import Arrays
from ursa.protocol.envelope import decode, encode
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import (
    CLIMB_DUAL,
    BaseMessage,
    ErrorReply,
    MeanReport,
    MeanSum,
)
from ursa.protocol.topics import down_topic, global_topic, name_for, up_topic
from ursa.tools.data.federation import Federation, PartitionSpec, build_federation
from ursa.tools.data.loaders import load_digits

CONFIG = ClimbConfig(eta_d=0.5)


@pytest.fixture(scope="module")
def fed() -> Federation:
    spec = PartitionSpec(kind="climb", num_devices=6, rho=5, alpha=0.1, num_minority=2)
    return build_federation(load_digits(), spec, np.random.default_rng(0))


@pytest.fixture(scope="module")
def arrays(fed: Federation) -> Arrays:
    config = {"input_dim": fed.input_dim, "num_classes": 10, "hidden_sizes": [16]}
    return initial_arrays("mlp", config, seed=0)


@pytest.fixture
def fleet(fed: Federation) -> Iterator[ClimbFleet]:
    built = ClimbFleet(fed.devices, CONFIG, dual_period=2, key_bits=512, num_classes=10)
    try:
        yield built
    finally:
        built.close()


def _publish(fleet: ClimbFleet, topic: str, message: BaseMessage) -> None:
    raw = InMemoryTransport(fleet.bus, "raw")
    raw.connect()
    raw.publish(topic, encode(message))
    raw.close()


def _heard(fleet: ClimbFleet, pattern: str) -> list[BaseMessage]:
    seen: list[BaseMessage] = []
    spy = InMemoryTransport(fleet.bus, "spy")
    spy.set_handler(lambda topic, payload: seen.append(decode(payload)))
    spy.subscribe(pattern)
    spy.connect()
    return seen


def test_the_dual_steps_are_climbs_update_on_the_fleets_means(
    fed: Federation, arrays: Arrays, fleet: ClimbFleet
) -> None:
    lambdas = np.zeros(fed.num_devices)
    for round_index in (1, 3):  # dual_period 2: rounds 1, 3, ...
        assert fleet.dual_step(round_index, arrays)
        losses = device_losses(arrays, fed.devices)
        means = plain_dual_means(losses, lambdas, CONFIG)
        weights, lambdas = apply_dual_means_all(losses, lambdas, means, CONFIG)
        np.testing.assert_allclose(fleet.weights, weights, atol=1e-6)
        np.testing.assert_allclose(fleet.lambdas, lambdas, atol=1e-6)
    assert lambdas.max() > 0  # the second step moved the weights off 1
    assert fleet.rejections == []


def test_a_round_without_a_dual_step_changes_nothing(
    arrays: Arrays, fleet: ClimbFleet
) -> None:
    heard = _heard(fleet, f"ursa/v1/{FEDERATION}/#")

    assert not fleet.dual_step(2, arrays)

    assert heard == [] and list(fleet.weights) == [1.0] * len(fleet.devices)


def test_a_device_the_bus_never_reaches_is_left_out_at_the_deadline(
    fed: Federation, arrays: Arrays, fleet: ClimbFleet
) -> None:
    lost = device_id(2)
    fleet.bus.drop_filter = lambda sender, receiver, topic, payload: (
        lost
        in (
            sender,
            receiver,
        )
    )
    start = fleet.clock()

    assert fleet.dual_step(1, arrays)

    assert fleet.clock() > start  # closed by its deadline, not by the reports
    others = [i for i in range(fed.num_devices) if device_id(i) != lost]
    losses = device_losses(arrays, [fed.devices[i] for i in others])
    zeros = np.zeros(len(others))
    weights, _ = apply_dual_means_all(
        losses, zeros, plain_dual_means(losses, zeros, CONFIG), CONFIG
    )
    np.testing.assert_allclose(fleet.weights[others], weights, atol=1e-6)
    assert fleet.weights[2] == 1.0  # no sum reached it: it keeps its weight


def test_a_sum_not_signed_by_the_coordinator_is_refused(
    arrays: Arrays, fleet: ClimbFleet
) -> None:
    forged = MeanSum(
        federation=FEDERATION, round=1, sender="coordinator", purpose=CLIMB_DUAL,
        epoch=1, model="mlp", model_version=1, ciphertext=b"\x00" * 64,
        num_parties=1,
    )  # fmt: skip

    _publish(fleet, global_topic(FEDERATION, name_for("mean_sum")), forged)

    assert all(
        reason.startswith("not the coordinator's")
        for kind, reason in fleet.rejections
        if kind == "mean_sum"
    )
    assert len(fleet.rejections) == len(fleet.devices)
    assert list(fleet.weights) == [1.0] * len(fleet.devices)


def test_a_report_with_no_open_step_gets_a_signed_late_reply(
    fleet: ClimbFleet,
) -> None:
    device = device_id(0)
    replies = _heard(fleet, down_topic(FEDERATION, device, name_for("error")))
    stray = MeanReport(
        federation=FEDERATION, round=5, sender=device, purpose=CLIMB_DUAL,
        epoch=1, model="mlp", model_version=5, ciphertext=b"\x01",
    )  # fmt: skip

    _publish(fleet, up_topic(FEDERATION, device, name_for("mean_report")), stray)

    (refusal,) = fleet.host.rejections
    assert (refusal.device, refusal.code) == (device, "late")
    (reply,) = replies
    assert isinstance(reply, ErrorReply) and reply.in_reply_to == stray.message_id
    assert reply.signature  # the coordinator signs its replies


def test_an_undecodable_report_is_refused_as_malformed(fleet: ClimbFleet) -> None:
    device = device_id(1)
    raw = InMemoryTransport(fleet.bus, "raw")
    raw.connect()
    raw.publish(up_topic(FEDERATION, device, name_for("mean_report")), b"\x00junk")
    raw.close()

    (refusal,) = fleet.host.rejections
    assert (refusal.device, refusal.kind, refusal.code) == (device, "?", "malformed")
