"""A federation of real processes on a private Mosquitto, and the faults to inject.

`FaultFleet` writes a coordinator config and one config per device (training
on a slice of the bundled digits; a held-out slice stays for judging), runs
``python -m ursa.tools.cli.service coordinator serve`` and ``device run``
subprocesses against a `MosquittoBroker` with persistence (QoS 1 sessions and
retained messages survive a restart), and injects faults from outside:
SIGKILL of any process, broker stop and start on the same port. Every process
appends to its own log in ``work_dir/logs``; a restarted process appends to
the same file.

A run is judged from outside only: the coordinator's exit code and log, its
store read (read-only) after it exits, the model checkpoints under its state
directory, and the final model's accuracy on the held-out digits.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ursa.coordinator.model_store import ModelStore
from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.paillier_keys import MIN_SECURE_KEY_BITS
from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.transport import MessageHandler
from ursa.tools.broker.mosquitto import MosquittoBroker

__all__ = ["OBSERVER", "ROGUE", "FaultFleet", "FleetSettings", "RunOutcome"]

HIDDEN_SIZES = (16,)
HELD_OUT = 397
"""Digits kept out of every device's data, for the accuracy check."""
ROGUE = "r00"
"""A device identity the broker knows (password, ACL) but no process runs:
the credentials a hostile test publishes with."""
OBSERVER = "observer"
"""A read-only broker user (captures, replays)."""
MODEL = "classifier"
_ROUND_RE = re.compile(r"round (\d+): (\d+) updates -> version (\d+)")
_UPDATE_RE = re.compile(r"round (\d+): update \d+/\d+ from (\S+) ")


@dataclass(frozen=True)
class FleetSettings:
    """The federation's shape; small defaults keep a run well under a minute."""

    devices: int = 6
    k: int = 3
    rounds: int = 3
    min_devices: int | None = None
    """Devices online before the first key epoch (None: all of them)."""
    quorum: int | None = None
    rounds_per_epoch: int = 0
    samples_per_device: int = 150
    epochs: int = 2
    key_bits: int = 512
    seed: int = 3
    selection: str = "dubhe"
    """``dubhe`` or ``random``."""
    training: str = "fedavg"
    """``fedavg`` or ``climb`` (FedAvg weighted by an encrypted mean of duals)."""
    flicker: bool = False
    """FLICKER balances the devices' data before the first key epoch."""
    flicker_nabla: float = 0.1
    """FLICKER stops once the global imbalance (min/max count) reaches it."""
    flicker_max_updates: int = 3
    """FLICKER's resampling updates at most (a bound on its loop)."""
    training_s: float = 30.0
    phase_s: float = 5.0
    """Volunteer, distributions and agent deadlines."""
    key_epoch_s: float = 20.0
    outage_grace_s: float = 10.0
    reconnect_max_delay_s: int = 2
    identity_key_apart: bool = False
    """Keep the coordinator's identity key outside its state directory (so
    `reset_coordinator` wipes the store and keeps the identity)."""
    max_message_bytes: int | None = None
    """The coordinator's admission size cap (None: its default)."""
    admission_burst: int | None = None
    """The coordinator's per-device admission burst (None: its default), so
    a flood test overruns it without depending on the machine's speed."""


@dataclass
class RunOutcome:
    """What a finished run looks like from outside."""

    exit_code: int
    completed_rounds: int
    updates_per_round: dict[int, int]
    contributors: dict[int, list[str]] = field(default_factory=dict)
    """Per round, each device that had an update accepted (a device twice if
    it was counted twice)."""
    model_version: int = 0
    accuracy: float = 0.0


class FaultFleet:
    """Broker, coordinator and device processes for one fault-injection run.

    Args:
        work_dir: configs, state directories, data and logs go here.
        settings: the federation's shape.
        mosquitto: the mosquitto binary (default: found on PATH).
        name: the federation name.
    """

    def __init__(
        self,
        work_dir: Path,
        settings: FleetSettings,
        *,
        mosquitto: Path | None = None,
        name: str = "faults",
    ) -> None:
        self.work_dir = work_dir
        self.settings = settings
        self.name = name
        self.device_ids = tuple(f"d{i:02d}" for i in range(settings.devices))
        self.logs = work_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.broker = MosquittoBroker(
            devices=(*self.device_ids, ROGUE),
            readers=(OBSERVER,),
            persistence=True,
            binary=mosquitto,
            work_dir=work_dir / "broker",
        )
        self.state_dir = work_dir / "coordinator"
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.devices: dict[str, subprocess.Popen[bytes]] = {}
        self._sessions: list[MqttTransport] = []
        self._x_test, self._y_test = self._write_files()

    # --- processes ----------------------------------------------------------------

    def start_broker(self) -> None:
        """Start (or start again) the broker on its port."""
        self.broker.start()

    def stop_broker(self) -> None:
        """Stop the broker (SIGTERM: Mosquitto saves its persistence file)."""
        self.broker.stop()  # work_dir is ours: its files stay

    def start_coordinator(self) -> None:
        """Start ``coordinator serve`` (again, after a kill: same state)."""
        self.coordinator = self._spawn(
            "coordinator",
            ["coordinator", "serve", "--config", str(self._config("coordinator"))],
        )

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator and reap it."""
        assert self.coordinator is not None
        _kill(self.coordinator)

    def reset_coordinator(self) -> None:
        """Wipe the (killed) coordinator's state directory: an empty store.

        With ``identity_key_apart`` the identity key outlives it, as an
        operator's backup would.
        """
        assert self.coordinator is None or self.coordinator.poll() is not None
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def start_device(self, device_id: str) -> None:
        """Start ``device run`` for one device (again, after a kill: a reboot)."""
        self.devices[device_id] = self._spawn(
            device_id, ["device", "run", "--config", str(self._config(device_id))]
        )

    def start_devices(self, device_ids: Iterable[str] | None = None) -> None:
        """Start several devices (default: all)."""
        for device_id in self.device_ids if device_ids is None else device_ids:
            self.start_device(device_id)

    def kill_device(self, device_id: str) -> None:
        """SIGKILL a device process and reap it (power cut)."""
        _kill(self.devices.pop(device_id))

    def wait_coordinator(self, timeout_s: float) -> int:
        """Wait for the coordinator to exit; return its exit code (-9 on timeout).

        A coordinator still running at the timeout is killed: the run wedged.
        """
        assert self.coordinator is not None
        try:
            return self.coordinator.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(self.coordinator)
            return -9

    def stop_devices(self) -> dict[str, int]:
        """SIGTERM every device; return each one's exit code (it may have exited).

        A device still running 30 s later is hung: it gets SIGABRT, so its
        log ends with every thread's stack (``PYTHONFAULTHANDLER``), then
        SIGKILL if it outlives that too. A hang in the interpreter's own
        teardown (after faulthandler is gone) leaves no stack: attach gdb.
        """
        for process in self.devices.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = {}
        for device_id, process in self.devices.items():
            try:
                codes[device_id] = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                codes[device_id] = _abort(process)
        self.devices.clear()
        return codes

    def close(self) -> None:
        """Kill whatever still runs and stop the broker."""
        for process in [self.coordinator, *self.devices.values()]:
            if process is not None and process.poll() is None:
                _kill(process)
        self.devices.clear()
        for session in self._sessions:
            session.close()
        self._sessions.clear()
        self.broker.stop()

    def connect(
        self,
        user: str,
        subscriptions: Iterable[str] = (),
        *,
        on_message: MessageHandler | None = None,
    ) -> MqttTransport:
        """An MQTT session as `user` (`ROGUE`, `OBSERVER`); closed by `close`."""
        config = self.broker.mqtt_config(user).model_copy(
            update={"keepalive_s": 5, "timeout_s": 5.0}
        )
        transport = MqttTransport(config)
        self._sessions.append(transport)
        transport.set_handler(on_message)
        for pattern in subscriptions:
            transport.subscribe(pattern)
        transport.connect()
        return transport

    # --- watching -----------------------------------------------------------------

    def log(self, name: str = "coordinator") -> str:
        """One process's log so far (all its incarnations)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def all_logs(self) -> dict[str, str]:
        """Every process's log, by name."""
        return {p.stem: p.read_text(errors="replace") for p in self.logs.glob("*.log")}

    def wait_for_log(
        self, pattern: str, *, name: str = "coordinator", timeout_s: float = 180.0
    ) -> re.Match[str]:
        """Wait until a log matches `pattern` (a regex); return the match.

        Raises:
            AssertionError: the timeout passed, or the coordinator exited.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            found = regex.search(self.log(name))
            if found is not None:
                return found
            exited = self.coordinator is not None and self.coordinator.poll()
            if exited is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} in {name}.log (coordinator exit {exited}):\n"
                    + self.log(name)[-3000:]
                )
            time.sleep(0.1)

    # --- judging ------------------------------------------------------------------

    def outcome(self, exit_code: int, *, since: int = 0) -> RunOutcome:
        """Judge the run after the coordinator exited (its log from ``since`` on)."""
        text = self.log()[since:]
        updates: dict[int, int] = {}
        for match in _ROUND_RE.finditer(text):
            updates[int(match[1])] = int(match[2])
        contributors: dict[int, list[str]] = {}
        for match in _UPDATE_RE.finditer(text):
            contributors.setdefault(int(match[1]), []).append(match[2])
        latest = ModelStore(self.state_dir, MODEL).latest()
        return RunOutcome(
            exit_code=exit_code,
            completed_rounds=self.completed_rounds(),
            updates_per_round=updates,
            contributors=contributors,
            model_version=0 if latest is None else latest.version,
            accuracy=self.accuracy(),
        )

    def completed_rounds(self) -> int:
        """Rounds marked complete in the coordinator's store (opened read-only)."""
        path = self.state_dir / DB_FILENAME
        if not path.exists():
            return 0
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT COUNT(*) FROM rounds WHERE completed = 1")
            return int(row.fetchone()[0])
        finally:
            db.close()

    def accuracy(self) -> float:
        """The latest checkpoint's accuracy on the held-out digits."""
        import torch  # the judge only; the harness itself needs no torch

        from ursa.models.registry import build_model, load_arrays

        store = ModelStore(self.state_dir, MODEL)
        latest = store.latest()
        if latest is None:
            return 0.0
        model = build_model("mlp", self._model_options())
        load_arrays(model, store.load_arrays(latest))
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(self._x_test))
        predicted = logits.argmax(dim=1).numpy()
        return float(np.mean(predicted == self._y_test))

    def tracebacks(self) -> dict[str, str]:
        """Every log with a traceback or a faulthandler dump, and the text near it."""
        found = {}
        for name, text in self.all_logs().items():
            hits = [text.find(m) for m in ("Traceback", "Fatal Python error")]
            at = min((i for i in hits if i >= 0), default=-1)
            if at >= 0:
                found[name] = text[max(0, at - 500) : at + 2500]
        return found

    # --- files --------------------------------------------------------------------

    def _model_options(self) -> dict[str, object]:
        return {"input_dim": 64, "num_classes": 10, "hidden_sizes": list(HIDDEN_SIZES)}

    def _config(self, name: str) -> Path:
        return self.work_dir / f"{name}.toml"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        user = "coordinator" if name == "coordinator" else name
        env = dict(
            os.environ,
            URSA_BROKER__PASSWORD=self.broker.credentials[user],
            PYTHONFAULTHANDLER="1",  # stacks in the log on SIGABRT (a hang)
        )
        command = [sys.executable, "-m", "ursa.tools.cli.service", *args]
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def _write_files(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Write every config, each device's data and the initial weights."""
        from ursa.tools.data.loaders import load_digits

        digits = load_digits()
        x, y = digits.flat().astype(np.float32), np.asarray(digits.y, dtype=np.int64)
        order = np.random.default_rng(0).permutation(len(y))
        test, train = order[:HELD_OUT], order[HELD_OUT:]
        s = self.settings
        for i, device_id in enumerate(self.device_ids):
            part = np.take(
                train, range(i * s.samples_per_device, (i + 1) * s.samples_per_device),
                mode="wrap",
            )  # fmt: skip
            data = self.work_dir / f"{device_id}.npz"
            np.savez(data, x=x[part], y=y[part])
            self._config(device_id).write_text(self._device_toml(device_id, data))
        weights = self.work_dir / "initial.ursw"
        self._model_init(weights)
        self._config("coordinator").write_text(self._coordinator_toml(weights))
        return x[test], y[test]

    def _model_init(self, weights: Path) -> None:
        command = [
            sys.executable, "-m", "ursa.tools.cli.service", "model", "init",
            "--classes", "10", "--input-dim", "64",
            "--hidden-sizes", *map(str, HIDDEN_SIZES),
            "--seed", str(self.settings.seed), "--out", str(weights),
        ]  # fmt: skip
        subprocess.run(command, check=True, timeout=120, capture_output=True)

    def _broker_toml(self, user: str) -> str:
        return (
            f'[broker]\nurl = "mqtt://127.0.0.1:{self.broker.port}"\n'
            f'username = "{user}"\nkeepalive_s = 5\nreconnect_min_delay_s = 1\n'
            f"reconnect_max_delay_s = {self.settings.reconnect_max_delay_s}\n"
        )

    def _methods_toml(self, *, coordinator: bool = False) -> str:
        s = self.settings
        training = f'[[methods]]\nkind = "{s.training}"\n'
        if coordinator and s.training == "climb":
            training += f"dual_timeout_s = {s.training_s}\n"
        flicker = ""
        if s.flicker:
            flicker = '[[methods]]\nkind = "flicker"\n'
            if coordinator:
                flicker += (
                    f"nabla = {s.flicker_nabla}\n"
                    f"max_updates = {s.flicker_max_updates}\n"
                    f"hop_deadline_s = {s.phase_s}\n"
                    f"reply_deadline_s = {s.training_s}\n"
                    f"redundancy_deadline_s = {s.phase_s}\n"
                )
        return f'[[methods]]\nkind = "{s.selection}"\n' + training + flicker

    def _coordinator_toml(self, weights: Path) -> str:
        s = self.settings
        quorum = "" if s.quorum is None else f"quorum = {s.quorum}\n"
        min_devices = s.devices if s.min_devices is None else s.min_devices
        identity = (
            f'identity_key = "{self.work_dir / "coordinator-identity.key"}"\n'
            if s.identity_key_apart
            else ""
        )
        if s.max_message_bytes is not None:
            quorum += f"max_message_bytes = {s.max_message_bytes}\n"
        return (
            f'federation = "{self.name}"\nstate_dir = "{self.state_dir}"\n'
            + identity
            + f"min_devices = {min_devices}\nk = {s.k}\ntries = 3\n"
            f"rounds = {s.rounds}\nrounds_per_epoch = {s.rounds_per_epoch}\n"
            f"key_bits = {s.key_bits}\nseed = {s.seed}\n"
            f"insecure_test_keys = {str(s.key_bits < MIN_SECURE_KEY_BITS).lower()}\n"
            + quorum
            + self._broker_toml("coordinator")
            + (
                ""
                if s.admission_burst is None
                else f"[admission]\nburst = {s.admission_burst}\n"
            )
            + '[enrolment]\nmode = "tofu"\n'
            + f"[deadlines]\nvolunteer_s = {s.phase_s}\n"
            f"distributions_s = {s.phase_s}\nagent_s = {s.phase_s}\n"
            f"key_epoch_s = {s.key_epoch_s}\nregistration_s = {s.key_epoch_s}\n"
            f"training_s = {s.training_s}\noutage_grace_s = {s.outage_grace_s}\n"
            f'[training]\ninitial_weights = "{weights}"\n'
            f"update_timeout_s = {s.training_s}\n"
            + self._methods_toml(coordinator=True)
        )

    def _device_toml(self, device_id: str, data: Path) -> str:
        s = self.settings
        return (
            f'device_id = "{device_id}"\nfederation = "{self.name}"\n'
            f'state_dir = "{self.work_dir / device_id}"\nobfuscator_pool_size = 2\n'
            f"insecure_test_keys = {str(s.key_bits < MIN_SECURE_KEY_BITS).lower()}\n"
            + self._broker_toml(device_id)
            + f'[training]\ndata_file = "{data}"\n'
            "model_options = { input_dim = 64, num_classes = 10, "
            f"hidden_sizes = {list(HIDDEN_SIZES)} }}\n"
            f"train = {{ epochs = {s.epochs}, batch_size = 8, lr = 0.1 }}\n"
            + self._methods_toml()
        )


def _abort(process: subprocess.Popen[bytes]) -> int:
    """SIGABRT a hung process (faulthandler logs its stacks); its exit code."""
    process.send_signal(signal.SIGABRT)
    try:
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill(process)
        return -9


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
