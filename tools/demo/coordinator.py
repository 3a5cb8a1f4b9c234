"""The coordinator side of `ursa demo`: broker, config, training plugin, weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ursa.tools.demo.settings import (
    DUAL_TIMEOUT_S,
    FEDERATION,
    UPDATE_TIMEOUT_S,
    DemoError,
    TrainingDemoSettings,
)

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.feddisk_plugin import FeddiskPlugin
    from ursa.coordinator.training import Evaluator, RoundRecord, TrainingPlugin

__all__ = [
    "MadeHooks",
    "coordinator_config",
    "start_broker",
    "training_plugin",
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
    s: TrainingDemoSettings, workdir: Path, url: str
) -> CoordinatorConfig:
    """The coordinator's config: all devices must enrol; deadlines for 2 cores."""
    from ursa.coordinator.config import (
        BrokerConfig,
        CoordinatorConfig,
        DeadlinesConfig,
        EnrolmentConfig,
        RegistryConfig,
    )

    random = s.selection == "random"
    registry = (
        RegistryConfig(groups=(10,), sigma=(0.0,)) if random else RegistryConfig()
    )
    return CoordinatorConfig(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        broker=BrokerConfig(url=url),
        enrolment=EnrolmentConfig(mode="tofu"),
        registry=registry,
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
            volunteer_s=60,
            distributions_s=60,
            agent_s=60,
            training_s=UPDATE_TIMEOUT_S + 2 * DUAL_TIMEOUT_S + 60,
        ),
    )


def training_plugin(
    s: TrainingDemoSettings,
    workdir: Path,
    initial: Path,
    evaluate: Evaluator,
    on_round: Callable[[RoundRecord], None],
    made: MadeHooks | None = None,
) -> TrainingPlugin | FeddiskPlugin:
    """The coordinator's training phase for the chosen weighting.

    FedDisk needs ``made``: the MADE's initial weights and its round hooks.
    """
    from ursa.coordinator.aggregation import Weighting
    from ursa.coordinator.feddisk_plugin import FeddiskConfig, FeddiskPlugin
    from ursa.coordinator.training import TrainingConfig, TrainingPlugin

    weighting = Weighting.CLIMB if s.weighting == "climb" else Weighting.FEDAVG
    config = TrainingConfig(
        weighting=weighting,
        dual_period=s.dual_period,
        update_timeout_s=UPDATE_TIMEOUT_S,
        dual_timeout_s=DUAL_TIMEOUT_S,
    )
    classifier = TrainingPlugin(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        config=config,
        initial_weights=initial,
        evaluate=evaluate,
        on_round=on_round,
    )
    if s.weighting != "feddisk":
        return classifier
    if made is None:
        raise DemoError("feddisk needs the MADE's initial weights")
    feddisk = FeddiskConfig(
        max_made_rounds=s.made_rounds,
        loss_timeout_s=DUAL_TIMEOUT_S,
        verdict_timeout_s=DUAL_TIMEOUT_S,
    )
    made_plugin = TrainingPlugin(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        config=config.model_copy(update={"model": feddisk.made_model}),
        initial_weights=made.initial,
        evaluate=made.evaluate,
        on_round=made.on_round,
    )
    return FeddiskPlugin(
        federation=FEDERATION,
        made=made_plugin,
        classifier=classifier,
        config=feddisk,
        on_switch=made.on_switch,
    )


@dataclass(frozen=True)
class MadeHooks:
    """FedDisk's MADE rounds in the demo: initial weights and callbacks."""

    initial: Path
    evaluate: Evaluator
    on_round: Callable[[RoundRecord], None]
    on_switch: Callable[[int, int], None]
