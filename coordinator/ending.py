"""The end of the federation: when it comes, and what the coordinator does then.

It ends when the configured rounds are complete, or earlier when the last
round's accuracy reached ``target_accuracy``. The coordinator then asks its
`RoundPlugin` for the final model, publishes the signed, retained
`FederationEnd` and writes the final model's files (`ursa.coordinator.
federation_end` holds the message and the files; this component decides and
acts).
"""

from __future__ import annotations

import logging

from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.federation_end import (
    FinalOutput,
    end_message,
    write_final_model,
)
from ursa.coordinator.method_context import Signer
from ursa.coordinator.plugin import RoundPlugin, Send
from ursa.coordinator.store import CoordinatorStore

__all__ = ["Ending"]

logger = logging.getLogger("ursa.coordinator")


class Ending:
    """Decides that the federation is over and announces it (module docstring).

    Args:
        config: Rounds, target accuracy, where the final model goes.
        plugin: The training plugin (metrics, the final model).
        final_output: The architecture and ONNX exporter, if known.
        send: Queues a message (None: the global topic).
        sign: The coordinator's signing point.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        plugin: RoundPlugin,
        final_output: FinalOutput | None,
        send: Send,
        sign: Signer,
    ) -> None:
        self._config = config
        self._plugin = plugin
        self._final_output = final_output
        self._send = send
        self._sign = sign

    def is_due(self, store: CoordinatorStore, last_round: int) -> bool:
        """Whether no further round opens (all done, or the target reached)."""
        rounds = self._config.rounds
        if store.completed_rounds() >= rounds:
            logger.info("all %d rounds complete", rounds)
            return True
        return self._target_reached(last_round)

    def _target_reached(self, last_round: int) -> bool:
        """Whether the last round's accuracy reached ``target_accuracy``."""
        target = self._config.target_accuracy
        if target is None:
            return False
        accuracy = self._plugin.last_metrics().get("accuracy")
        if not isinstance(accuracy, int | float) or not accuracy >= target:
            return False
        logger.info(
            "round %d reached accuracy %.4f >= target %.4f; ending the federation",
            last_round,
            accuracy,
            target,
        )
        return True

    def announce(self, rounds: int) -> None:
        """Publish the signed, retained `FederationEnd`; write the final model."""
        final = self._plugin.final_model(self._send)
        message = end_message(self._config.federation, rounds, final)
        self._send(self._sign(message), None)
        if final is None:
            logger.info("federation over after %d rounds (no model)", rounds)
            return
        logger.info(
            "federation over after %d rounds: final %s version %d %s",
            rounds,
            final.model,
            final.version,
            dict(message.metrics),
        )
        cfg = self._config
        folder = cfg.final_model_dir or cfg.state_dir / "final"
        output = self._final_output
        try:
            written = write_final_model(
                folder,
                final,
                rounds=rounds,
                methods=cfg.method_names(),
                architecture=None if output is None else output.card,
                export=None if output is None else output.export,
            )
        except OSError as exc:
            logger.error("could not write the final model to %s: %s", folder, exc)
            return
        logger.info("final model written to %s: %s", folder, ", ".join(written))
