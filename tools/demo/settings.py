"""What `ursa demo` (training) runs: its settings, their checks and constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ursa.coordinator.methods_config import Draw

__all__ = ["DemoError", "TrainingDemoSettings", "methods_options"]

FEDERATION = "demo"
ARCHITECTURE = "mlp"
SELECTIONS = ("dubhe", "random")
UPDATE_TIMEOUT_S = 120.0
DUAL_TIMEOUT_S = 60.0
VOLUNTEER_S = 3.0
"""Dubhe's volunteering window: silence means no, so nearly every round waits
it out (it ends early only when every try already has K yes-draws). The
demo's devices are idle on one machine when a round is announced and
answer within a second; a late yes-volunteer is only replaced by a top-up."""
WEIGHTINGS = ("none", "climb", "feddisk")
BALANCES = ("none", "flicker")


class DemoError(ValueError):
    """Settings the demo cannot run (the message says why)."""


_TRAINING_NAMES = {"fedavg": "none", "climb": "climb", "feddisk": "feddisk"}


def methods_options(methods: str) -> dict[str, str]:
    """``--methods dubhe,climb,flicker`` as the settings' selection/weighting/balance.

    Raises:
        DemoError: an unknown method, none or two of a role, or one twice.
    """
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = sorted(set(names) - {*SELECTIONS, *_TRAINING_NAMES, "flicker"})
    if unknown:
        raise DemoError(f"--methods: unknown {', '.join(unknown)}")
    if len(set(names)) != len(names):
        raise DemoError("--methods: a method is named twice")
    selection = [m for m in names if m in SELECTIONS]
    training = [m for m in names if m in _TRAINING_NAMES]
    if len(selection) != 1 or len(training) != 1:
        raise DemoError(
            "--methods needs one selection (dubhe, random) and one training "
            "method (fedavg, climb, feddisk)"
        )
    return {
        "selection": selection[0],
        "weighting": _TRAINING_NAMES[training[0]],
        "balance": "flicker" if "flicker" in names else "none",
    }


@dataclass(frozen=True)
class TrainingDemoSettings:
    """What `ursa demo` runs (the CLI's options)."""

    devices: int = 20
    k: int = 8
    tries: int = 5
    rounds: int = 25
    rho: float = 10.0
    emd: float = 1.5
    selection: str = "dubhe"
    draw: Draw = "paper"
    """Dubhe's volunteer draw: ``paper`` or ``stratified``."""
    weighting: str = "climb"
    balance: str = "none"
    key_bits: int = 2048
    local_epochs: int = 5
    batch_size: int = 4
    lr: float = 0.1
    hidden_sizes: tuple[int, ...] = (128, 128)
    eta_d: float = 0.1
    epsilon: float = 0.002
    dual_period: int = 1
    eval_every: int = 5
    """Federated evaluation before every ``eval_every``-th round (0: never)."""
    eval_fraction: float = 0.2
    """Each device's samples held out for federated evaluation."""
    made_rounds: int = 50
    """FedDisk: the cap on MADE rounds (the phase stops earlier when the
    fleet's validation loss rises)."""
    wire_dtype: str = "float32"
    aggregation: str = "secure"
    """How the rounds sum updates: ``secure`` (masked) or ``plain`` (debugging)."""
    noise_multiplier: float = 0.0
    """Distributed DP on the secure sums (0: off)."""
    clip_norm: float = 10.0
    """The L2 bound on each device's delta in a secure sum (the DP sensitivity)."""
    test_fraction: float = 0.25
    seed: int = 0
    processes: int | None = None
    report_dir: Path = Path("ursa-report")
    broker_url: str | None = None
    timeout_s: float = 900.0
    http: str | None = None
    """``HOST:PORT`` of the dashboard, /api/status and /metrics while it runs."""
    http_token: str | None = None
    """The HTTP view's token (needed beyond loopback; never in the report)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def methods(self) -> list[str]:
        """The methods this demo runs, as ``--methods`` names them."""
        training = {v: k for k, v in _TRAINING_NAMES.items()}[self.weighting]
        balance = ["flicker"] if self.balance == "flicker" else []
        return [self.selection, training, *balance]

    def check(self) -> None:
        """Raise `DemoError` for settings the demo cannot run."""
        if self.selection not in SELECTIONS:
            raise DemoError(f"selection must be one of {SELECTIONS}")
        if self.balance not in BALANCES:
            raise DemoError(f"balance must be one of {BALANCES}")
        if self.balance == "flicker" and self.devices < 3:
            raise DemoError("--balance flicker needs at least 3 devices (the ring)")
        if self.balance == "flicker" and self.weighting == "feddisk":
            raise DemoError("flicker with feddisk is not supported yet")
        if self.weighting not in WEIGHTINGS:
            raise DemoError(f"weighting must be one of {WEIGHTINGS}")
        if self.made_rounds < 1:
            raise DemoError("--made-rounds must be at least 1")
        if not 1 <= self.k <= self.devices:
            raise DemoError(f"need 1 <= K <= devices, got K={self.k}")
        if self.rounds < 1:
            raise DemoError("need at least one round")
