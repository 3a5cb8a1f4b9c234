"""The coordinator side of `ursa demo`: broker, config and its methods, weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ursa.coordinator.methods_config import (
    ClimbSpec,
    DubheSpec,
    FedAvgSpec,
    FeddiskSpec,
    FlickerSpec,
    MethodSpec,
    RandomSpec,
)
from ursa.tools.compose import RoundHooks, TrainingHooks
from ursa.tools.demo.settings import (
    DUAL_TIMEOUT_S,
    FEDERATION,
    UPDATE_TIMEOUT_S,
    VOLUNTEER_S,
    DemoError,
    TrainingDemoSettings,
)

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.training import Evaluator, TrainingRoundReport

__all__ = [
    "MadeHooks",
    "coordinator_config",
    "start_broker",
    "training_hooks",
    "write_initial_weights",
]


def write_initial_weights(
    path: Path, model_config: dict[str, Any], *, seed: int, architecture: str = "mlp"
) -> None:
    """Write seeded initial weights for the coordinator (needs the train extra)."""
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_to_bytes

    arrays = initial_arrays(architecture, model_config, seed=seed)
    path.write_bytes(arrays_to_bytes(arrays))


def start_broker(url: str | None) -> tuple[Any, str]:
    """The embedded broker (started) and its URL, or (None, the given URL)."""
    if url is not None:
        return None, url
    from ursa.tools.broker.embedded import EmbeddedBroker

    broker = EmbeddedBroker().start()
    return broker, broker.url


def coordinator_config(
    s: TrainingDemoSettings,
    workdir: Path,
    url: str,
    initial: Path | None = None,
    made_initial: Path | None = None,
) -> CoordinatorConfig:
    """The coordinator's config: all devices must enrol; deadlines for 2 cores.

    ``initial`` (the classifier's version 0) makes it a training federation
    under the settings' weighting; FedDisk needs ``made_initial`` too.
    """
    from ursa.coordinator.config import (
        BrokerConfig,
        CoordinatorConfig,
        DeadlinesConfig,
        EnrolmentConfig,
        EvaluationConfig,
        TrainingSection,
    )
    from ursa.coordinator.secure_aggregation.config import AggregationConfig

    random = s.selection == "random"
    methods: list[MethodSpec] = [RandomSpec() if random else DubheSpec(draw=s.draw)]
    training = None
    if initial is not None:
        methods.append(_training_method(s, made_initial))
        training = TrainingSection.model_validate(
            {"initial_weights": initial, "update_timeout_s": UPDATE_TIMEOUT_S}
        )
    if s.balance == "flicker":
        methods.append(FlickerSpec())
    return CoordinatorConfig(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        broker=BrokerConfig(url=url),
        enrolment=EnrolmentConfig(mode="tofu"),
        min_devices=s.devices,
        k=s.k,
        tries=1 if random else s.tries,
        # FedDisk: up to made_rounds MADE rounds come first; the harness stops
        # the run once s.rounds classifier rounds are done
        rounds=s.rounds + (s.made_rounds if s.weighting == "feddisk" else 0),
        key_bits=s.key_bits,
        seed=s.seed,
        deadlines=DeadlinesConfig(
            key_epoch_s=120,
            registration_s=120,
            volunteer_s=VOLUNTEER_S,
            distributions_s=60,
            agent_s=60,
            training_s=UPDATE_TIMEOUT_S + 3 * DUAL_TIMEOUT_S + 60,
        ),
        methods=tuple(methods),
        training=training,
        evaluation=EvaluationConfig(every=s.eval_every, timeout_s=DUAL_TIMEOUT_S),
        aggregation=AggregationConfig(
            mode="plain" if s.aggregation == "plain" else "secure",
            noise_multiplier=s.noise_multiplier,
            clip_norm=s.clip_norm,
        ),
    )


def _training_method(
    s: TrainingDemoSettings, made_initial: Path | None
) -> FedAvgSpec | ClimbSpec | FeddiskSpec:
    """The ``[[methods]]`` entry of the demo's ``--weighting``."""
    if s.weighting == "climb":
        return ClimbSpec(dual_period=s.dual_period, dual_timeout_s=DUAL_TIMEOUT_S)
    if s.weighting != "feddisk":
        return FedAvgSpec()
    if made_initial is None:
        raise DemoError("feddisk needs the MADE's initial weights")
    return FeddiskSpec(
        made_initial_weights=made_initial,
        max_made_rounds=s.made_rounds,
        loss_timeout_s=DUAL_TIMEOUT_S,
        verdict_timeout_s=DUAL_TIMEOUT_S,
    )


def training_hooks(
    evaluate: Evaluator,
    on_round: Callable[[TrainingRoundReport], None],
    made: MadeHooks | None = None,
) -> TrainingHooks:
    """The harness's callbacks for `ursa.tools.compose.training_plugin`."""
    if made is None:
        return TrainingHooks(classifier=RoundHooks(evaluate, on_round))
    return TrainingHooks(
        classifier=RoundHooks(evaluate, on_round),
        made=RoundHooks(made.evaluate, made.on_round),
        on_switch=made.on_switch,
    )


@dataclass(frozen=True)
class MadeHooks:
    """FedDisk's MADE rounds in the demo: initial weights and callbacks."""

    initial: Path
    evaluate: Evaluator
    on_round: Callable[[TrainingRoundReport], None]
    on_switch: Callable[[int, int], None]
