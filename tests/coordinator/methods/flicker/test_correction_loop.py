"""The correction loop's record: a restarted coordinator reopens the same request."""

from __future__ import annotations

import json

from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.correction_loop import CorrectionLoop


def test_an_open_request_survives_a_record_round_trip_with_a_fresh_deadline() -> None:
    state = fl.start(["d1", "d2", "d3"], [10, 900, 40], nabla=0.2)
    loop = CorrectionLoop(state, reply_deadline_s=30.0, now=0.0)
    request = loop.request
    assert request is not None and request.kind == "cosine"
    loop.on_cosine("d1", request.step, 0.1, now=1.0)

    again = CorrectionLoop.from_record(json.loads(json.dumps(loop.to_record())), 500.0)

    reopened = again.request
    assert reopened is not None
    assert (reopened.kind, reopened.step) == ("cosine", request.step)
    assert reopened.answered == {"d1"} and reopened.targets == request.targets
    assert reopened.deadline_at == 530.0
    assert again.state == loop.state
    again.on_cosine("d2", request.step, 0.9, now=501.0)
    again.on_cosine("d3", request.step, 0.3, now=501.0)
    assert again.request is not None and again.request.kind == "resample"
    assert again.request.targets == frozenset({"d2"})
