"""Climb on a fake device context: reports, the dual step, waiting, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.crypto.paillier import (
    PaillierPublicKey,
    encrypted_vector_from,
    sum_encrypted,
)
from ursa.edge_sdk.method import TrainPlan
from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    apply_dual_means,
    decrypt_dual_means,
    encrypt_dual_report,
    plain_dual_means,
)
from ursa.edge_sdk.methods.climb.method import DUAL_WAIT_S, Climb
from ursa.edge_sdk.secure_mean import SecureMeans
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    CLIMB_DUAL,
    ErrorReply,
    MeanReport,
    MeanRequest,
    MeanSum,
)
from ursa.protocol.router import Dispatch, Router

CONFIG = ClimbConfig(eta_d=0.5)
FED = "fed"
VERSION: Arrays = {"w": np.array([0.5, -0.25], np.float32)}


def attached(new_context: Any) -> tuple[Climb, Any, Router, SecureMeans]:
    ctx, router = new_context(), Router("d0")
    climb = Climb(ctx, CONFIG)
    means = SecureMeans(ctx, [climb])
    climb.register(router)
    means.register(router)
    climb.start()
    return climb, ctx, router, means


def request(round_index: int = 2, version: int = 1) -> MeanRequest:
    return MeanRequest(
        federation=FED, round=round_index, sender="coordinator",
        purpose=CLIMB_DUAL, epoch=3, model="mlp", model_version=version,
    )  # fmt: skip


def climb_sum(
    public: PaillierPublicKey, reports: list[bytes], round_index: int = 2
) -> MeanSum:
    vectors = [encrypted_vector_from(r, public) for r in reports]
    total = sum_encrypted(public, vectors)
    return MeanSum(
        federation=FED, round=round_index, sender="coordinator",
        purpose=CLIMB_DUAL, epoch=3, model="mlp", model_version=1,
        ciphertext=total.to_bytes(public), num_parties=len(reports),
    )  # fmt: skip


def test_the_report_waits_for_the_version_then_encrypts_f_and_lambda(
    new_context: Any, keys: Any
) -> None:
    _, ctx, router, means = attached(new_context)
    router.dispatch(request(version=1))
    assert ctx.sent == [] and ctx.wanted == [1]  # downloading first

    ctx.arrays[1] = VERSION
    means.on_model_ready()
    (report,) = ctx.sent
    assert isinstance(report, MeanReport) and (report.epoch, report.round) == (3, 2)
    assert report.purpose == CLIMB_DUAL and report.model_version == 1
    vector = encrypted_vector_from(report.ciphertext, keys[0])  # after the bytes trip
    means = decrypt_dual_means(keys[1], CONFIG, vector)
    assert means.mean_loss == pytest.approx(0.8, abs=1e-6)
    assert means.mean_lambda == pytest.approx(0.0, abs=1e-6)

    router.dispatch(request(version=1))  # re-published: the same report again
    assert ctx.sent == [report, report]


def test_the_sum_sets_the_weight_like_the_plaintext_step_and_persists_it(
    new_context: Any, keys: Any
) -> None:
    climb, ctx, router, _ = attached(new_context)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    (mine,) = ctx.sent
    assert isinstance(mine, MeanReport)
    other = encrypt_dual_report(keys[0], CONFIG, 0.2, 0.4).to_bytes(keys[0])
    assert not climb.ready_to_train(2)  # the dual step has not come yet

    router.dispatch(climb_sum(keys[0], [mine.ciphertext, other]))

    expected = apply_dual_means(
        0.0, 0.8, plain_dual_means([0.8, 0.2], [0.0, 0.4], CONFIG), CONFIG
    )
    assert climb.weight == pytest.approx(expected.weight, abs=1e-5)
    assert climb.lam == pytest.approx(expected.next_lambda, abs=1e-5)
    assert climb.ready_to_train(2) and ctx.retries == 1
    plan = climb.plan(TrainPlan(2))
    assert plan.scaled and plan.delta_scale == climb.weight
    assert ctx.training_stats.dual_steps == 1

    again = Climb(new_context(), CONFIG)
    again.start()
    assert (again.lam, again.weight) == (climb.lam, climb.weight)


def test_a_silent_dual_step_holds_training_for_dual_wait_s_only(
    new_context: Any, keys: Any
) -> None:
    climb, ctx, router, _ = attached(new_context)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    ctx.notice_age = DUAL_WAIT_S - 0.1
    assert not climb.ready_to_train(2)
    assert climb.ready_to_train(3)  # another round is not held
    ctx.notice_age = DUAL_WAIT_S
    assert climb.ready_to_train(2)
    assert climb.plan(TrainPlan(2)).delta_scale == 1.0  # the previous weight


def test_a_refused_report_stops_the_wait(new_context: Any, keys: Any) -> None:
    climb, ctx, router, means = attached(new_context)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    (report,) = ctx.sent
    refusal = ErrorReply(
        federation=FED, round=2, sender="coordinator", code="late",
        reason="the dual step is closed", in_reply_to=report.message_id,
    )  # fmt: skip
    means.on_error_reply(refusal.model_copy(update={"in_reply_to": "f" * 32}))
    assert not climb.ready_to_train(2)
    means.on_error_reply(refusal)
    assert climb.ready_to_train(2) and ctx.retries == 1


def test_without_the_epoch_key_a_request_waits(new_context: Any, keys: Any) -> None:
    _, ctx, router, _ = attached(new_context)
    ctx.epoch_keys = None
    assert router.dispatch(request()) is Dispatch.PARKED
    assert ctx.sent == []


def test_an_unreadable_state_resets_lambda(
    tmp_path: Path, new_context: Any, caplog: pytest.LogCaptureFixture
) -> None:
    DeviceStateDir(tmp_path / "d0").save_method_state("climb", {"lambda": "x"})
    climb, _, _, _ = attached(new_context)
    assert (climb.lam, climb.weight) == (0.0, 1.0)
    assert "CLIMB state unreadable" in caplog.text
