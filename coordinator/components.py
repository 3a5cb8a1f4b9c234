"""The coordinator's components, built once and handed their collaborators.

`Components` is the wiring of one coordinator: each part is made here with
the parts it needs (as objects or bound methods, never the service), so no
part reaches into another's state. `CoordinatorService` owns one and runs
its lifecycle (start, tick, stop). The order of construction is the order
of dependence; the late references (presence and enrolment changes go to
the key epoch, a keyed epoch opens a round, the methods' context reads the
key epoch and re-announces the round, the key epoch signs the training
plugin's aggregation mode) are looked up at call time. The methods' context
is made before the key epoch, so the balancing method (which the key epoch
runs) is built with it, as the selection method is; the training plugin is
built here, by composition's `PluginBuilder`, with that context and the
runtime's before-training steps (`StepRunner`), which the round cycle runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ursa.coordinator.admission import Admission
from ursa.coordinator.before_training import StepBuilder, StepContext
from ursa.coordinator.broker_link import BrokerLink
from ursa.coordinator.broker_outage import BrokerOutage, LivePhase
from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.ending import Ending
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.federation_end import FinalOutput
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.inbox import Inbox
from ursa.coordinator.key_epoch import KeyEpoch
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.registry import (
    balancing_method,
    migrate_store,
    selection_method,
)
from ursa.coordinator.own_identity import OwnIdentity
from ursa.coordinator.plugin import PluginBuilder, PluginContext, RoundPlugin
from ursa.coordinator.presence import Presence
from ursa.coordinator.ready_devices import ReadyDevices
from ursa.coordinator.recovery import Recovery
from ursa.coordinator.refusal_log import Keep, RefusalLog
from ursa.coordinator.rejections import Rejections
from ursa.coordinator.retained_sweep import RetainedSweep
from ursa.coordinator.round_cycle import RoundCycle
from ursa.coordinator.round_state import Stage
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageFunctions, StageMachine
from ursa.coordinator.step_runner import StepRunner
from ursa.coordinator.store import CoordinatorStore
from ursa.coordinator.store_batches import CommitPolicy
from ursa.coordinator.store_slot import StoreSlot
from ursa.coordinator.telemetry import Telemetry
from ursa.coordinator.training_health import TrainingHealth
from ursa.protocol.messages import COORDINATOR
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Router
from ursa.protocol.transport import Transport

__all__ = ["Components"]

logger = logging.getLogger("ursa.coordinator")


def _checked_plugin(config: CoordinatorConfig, plugin: RoundPlugin) -> RoundPlugin:
    """``plugin``, if it runs the training method ``[[methods]]`` names."""
    training = config.training_method()
    runs = plugin.methods()
    if runs != ((training.kind,) if training is not None else ()):
        named = training.kind if training is not None else "no training method"
        raise ValueError(
            f"[[methods]] names {named}, the training plugin runs "
            f"{', '.join(runs) or 'none'}"
        )
    return plugin


class Components:
    """Every part of one coordinator, wired (module docstring; the service's Args).

    Args:
        build_plugin: Builds the training plugin with the methods' context.
        steps: The methods' before-training steps, built with the context.
        keep_error: Stores a refusal for ``ursa coordinator status``.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        transport: Transport | None,
        clock: Clock,
        build_plugin: PluginBuilder,
        steps: Sequence[StepBuilder],
        rng: np.random.Generator,
        final_output: FinalOutput | None,
        telemetry: Telemetry,
        keep_error: Keep,
    ) -> None:
        self._federation = config.federation
        self._clock = clock
        self.telemetry = telemetry
        telemetry.set_methods(m.kind for m in config.methods)
        self.store = store = StoreSlot()
        """The store, handed to every part that persists (`open_store` fills it)."""
        self.outbox = outbox = Outbox("coordinator")
        self.stages = stages = StageMachine(telemetry, store)
        trust = config.trust.anchor(config.federation, COORDINATOR)
        self.identity = OwnIdentity(config, trust)
        self.presence = presence = Presence(
            grace_s=config.deadlines.outage_grace_s,
            on_change=lambda device, _online: self.key_epoch.device_changed(device),
        )
        self.refusals = refusals = RefusalLog(logger, keep=keep_error)
        self.devices = devices = EnrolledDevices(
            config,
            trust=trust,
            presence=presence,
            refusals=refusals,
            clock=clock,
            changed=lambda device: self.key_epoch.device_changed(device),
            store=store,
        )
        identity_refusals = IdentityRefusals(config.key_epochs)
        self.retained = RetainedSweep(config.federation, outbox, telemetry)
        self.outgoing = outgoing = SigningPoint(config.federation, outbox, telemetry)
        round_index = lambda: stages.state.round  # noqa: E731 - read by two
        self.link = BrokerLink(
            config,
            outbox=outbox,
            outgoing=outgoing,
            round_index=round_index,
            transport=transport,
        )
        telemetry.set_traffic(self._traffic)
        rejections = Rejections(
            config.federation,
            telemetry=telemetry,
            refusals=refusals,
            outgoing=outgoing,
            clock=clock,
            round_index=round_index,
        )
        self.admission = admission = Admission(
            config,
            telemetry=telemetry,
            refusals=refusals,
            reject=rejections.reject,
            run=lambda: outgoing.run,
            is_enrolled=lambda device: device in devices.identities,
        )
        ready = ReadyDevices(
            devices=devices,
            presence=presence,
            epoch=lambda: stages.state.epoch,
            store=store,
        )
        self.context = context = MethodContext(
            federation=self._federation,
            stores=lambda: store.store,
            online=ready.view,
            epoch=lambda: self.key_epoch.view(),
            sender=outgoing.send,
            signer=outgoing.sign,
            announcer=lambda: self.rounds.reannounce(),
            identities=devices.identities.get,
            certificates=lambda device: devices.certificates.get(device, b""),
            clock=clock,
            raw_sender=outgoing.send_raw,
        )
        """What methods are lent: the runtime's public surface only."""
        self.balancing = flicker = balancing_method(config, context)
        """The balancing method (FLICKER), if ``[[methods]]`` names one."""
        self.key_epoch = key_epoch = KeyEpoch(
            config,
            stages=stages,
            devices=devices,
            presence=presence,
            outgoing=outgoing,
            identity_refusals=identity_refusals,
            plugin=lambda: self.plugin,
            flicker=flicker,
            ready=ready,
            rng=rng,
            clock=clock,
            open_round=lambda now: self.rounds.start_round(now),
            forget_round=lambda: self.rounds.forget(),
            registered=lambda epoch, message: self.selection.registered(epoch, message),
            store=store,
        )
        self.steps = runner = StepRunner(
            StepContext(self._federation, context, outgoing.send, clock), steps
        )
        """The methods' before-training steps (the round cycle runs them)."""
        self.plugin = plugin = _checked_plugin(
            config, build_plugin(PluginContext(context, runner))
        )
        ending = Ending(
            config,
            plugin=plugin,
            final_output=final_output,
            send=outgoing.send,
            sign=outgoing.sign,
        )
        self.selection = selection = selection_method(config, context)
        self.health = TrainingHealth(sit_out_after=config.sit_out_after_failures)
        """The selected devices' streaks of failed training rounds (status)."""
        self.rounds = rounds = RoundCycle(
            config,
            stages=stages,
            selection=selection,
            plugin=plugin,
            steps=runner,
            ending=ending,
            outgoing=outgoing,
            telemetry=telemetry,
            rng=rng,
            clock=clock,
            online=presence.online,
            epoch=lambda: key_epoch.work,
            epoch_view=key_epoch.view,
            epoch_sets=key_epoch.sets,
            start_key_epoch=key_epoch.start,
            health=self.health,
            sit_out=key_epoch.sit_out,
            sitting_out=key_epoch.sitting_out,
            store=store,
        )
        self._stage_functions: StageFunctions = {
            Stage.ENROLMENT: key_epoch.stage_enrolment,
            Stage.BALANCING: key_epoch.stage_balancing,
            Stage.KEY_EPOCH: key_epoch.stage_key_epoch,
            Stage.REGISTRATION: key_epoch.stage_registration,
            Stage.SELECTING: rounds.stage_selecting,
            Stage.TRAINING: rounds.stage_training,
            Stage.DONE: lambda now: None,
        }
        live: tuple[LivePhase, ...] = (stages, key_epoch, selection, runner, plugin)
        self.outage = outage = BrokerOutage(
            presence, (*live, flicker) if flicker is not None else live
        )
        self.recovery = Recovery(
            config,
            stages=stages,
            rounds=rounds,
            devices=devices,
            presence=presence,
            identity_refusals=identity_refusals,
            key_epoch=key_epoch,
            selection=selection,
            flicker=flicker,
            outgoing=outgoing,
        )
        router = Router(COORDINATOR)
        self.inbox = Inbox(
            config,
            router=router,
            admission=admission,
            presence=presence,
            devices=devices,
            key_epoch=key_epoch,
            rounds=rounds,
            stages=stages,
            plugin=plugin,
            steps=runner,
            selection=selection,
            flicker=flicker,
            outage=outage,
            outgoing=outgoing,
            identity_refusals=identity_refusals,
            rejections=rejections,
            refusals=refusals,
            clock=clock,
            identity=lambda: self.identity.public,
            certificate=lambda: self.identity.certificate,
            step=self.step,
            store=store,
        )
        key_epoch.register(router)
        selection.register(router)
        if flicker is not None:
            flicker.register(router)

    def open_store(self, path: Path, policy: CommitPolicy) -> CoordinatorStore:
        """Open the store at ``path`` (the service starts), moved to this version.

        Every method's one-time migration of an older state dir runs first
        (`migrate_store`), then the parts persist into it (`StoreSlot.fill`).
        """
        store = CoordinatorStore(path, commit=policy)
        migrate_store(store)
        self.store.fill(store)
        return store

    def _traffic(self) -> tuple[int, int]:
        stats = self.link.stats
        return stats.bytes_sent, stats.bytes_received

    def step(self, now: float) -> None:
        """Run the current stage's function until the stage stops changing."""
        self.stages.settle(self._stage_functions, now)
