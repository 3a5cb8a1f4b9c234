"""One `ursa demo` run: data, broker, coordinator thread, device processes, report.

`DemoRun.execute` is the harness behind `ursa.tools.demo.training.run_training_demo`
(see its module docstring for what runs). The harness knows every device's
labels (it made the partition) and the test split; the coordinator knows
neither: it gets only the evaluation callback's figures for the report.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.paillier_keys import MIN_SECURE_KEY_BITS
from ursa.tools.compose import before_training_steps, training_plugin
from ursa.tools.demo.coordinator import (
    MadeHooks,
    coordinator_config,
    start_broker,
    training_hooks,
    write_initial_weights,
)
from ursa.tools.demo.devices import (
    spawn_devices,
    start_forkserver,
    wait_for_reports,
)
from ursa.tools.demo.fleet import DeviceSpec
from ursa.tools.demo.population import demo_population
from ursa.tools.demo.settings import (
    ARCHITECTURE,
    FEDERATION,
    DemoError,
    TrainingDemoSettings,
)
from ursa.tools.operator_provisioning import OperatorProvisioning

if TYPE_CHECKING:
    from ursa.coordinator.balancing import Balancing
    from ursa.coordinator.service import CoordinatorService
    from ursa.coordinator.training import TrainingRoundReport
    from ursa.tools.data.federation import Federation
    from ursa.tools.observe.server import ObserveServer

__all__ = ["DemoRun", "Progress"]

logger = logging.getLogger("ursa.demo")

RANDOM_BASELINE_DRAWS = 2000
BAR_WIDTH = 30
_STAGE_NOTES = {
    "enrolment": "waiting for every device to start and enrol",
    "balancing": "FLICKER: encrypted class counts, then resampling",
    "key_epoch": "key epoch: the agent makes the Paillier key and seals it",
    "registration": "devices register their encrypted categories",
    "selecting": "round 1: selection (Dubhe: volunteers, tries, the agent)",
    "training": "round 1: training",
}
_TRAINING_NOTES = {
    "climb": "round 1: training (CLIMB: the dual step first)",
    "feddisk": "round 1: FedDisk's global MADE trains first",
}


class Progress:
    """Per-round progress lines on stderr (from the coordinator's thread)."""

    def __init__(self, err: TextIO, total: int) -> None:
        self.err, self.total, self.started = err, total, time.perf_counter()
        self.lock = threading.Lock()

    def line(self, done: int, text: str) -> None:
        """A progress bar for ``done`` of the rounds, with ``text``."""
        filled = BAR_WIDTH * done // max(1, self.total)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = time.perf_counter() - self.started
        with self.lock:
            self.err.write(f"[{bar}] {done}/{self.total} {text} ({elapsed:.0f} s)\n")
            self.err.flush()

    def note(self, text: str) -> None:
        """A line of ``text`` with the time since the start."""
        with self.lock:
            elapsed = time.perf_counter() - self.started
            self.err.write(f"ursa demo: {text} ({elapsed:.0f} s)\n")
            self.err.flush()


class DemoRun:
    """Everything one demo run holds (see `execute`)."""

    def __init__(
        self, settings: TrainingDemoSettings, workdir: Path, progress: Progress
    ) -> None:
        self.settings = settings
        self.workdir = workdir
        self.progress = progress
        self.rounds: list[dict[str, Any]] = []
        self.made_rounds: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop_service = threading.Event()
        """Set to end the coordinator's loop (FedDisk: after the last classifier
        round, from the service thread, so no further round aggregates)."""
        self.telemetry = Telemetry()
        """The coordinator's, with the harness's ||p_o - p_u||_1 of each round."""
        self.telemetry.add_round_figures("l1_to_uniform")

    # --- data ----------------------------------------------------------------

    def _federation(self) -> Federation:
        try:
            return demo_population(self.settings)
        except ValueError as exc:  # PartitionError, FederationError
            raise DemoError(f"cannot deal the data out: {exc}") from None

    def _random_baseline(self, dists: np.ndarray) -> float:
        from ursa.tools.data.metrics import distance_to_uniform

        rng = np.random.default_rng([self.settings.seed, 1])
        picks = np.array(
            [
                rng.choice(len(dists), size=self.settings.k, replace=False)
                for _ in range(RANDOM_BASELINE_DRAWS)
            ]
        )
        return float(distance_to_uniform(dists[picks].mean(axis=1)).mean())

    # --- the run ---------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        """Run everything and return the report (also written to the folder)."""
        from ursa.tools.data.metrics import distance_to_uniform, distributions

        s = self.settings
        started = time.perf_counter()
        start_forkserver()  # the devices' parent imports torch meanwhile
        fed = self._federation()
        dists = distributions(fed.counts)
        ids = [f"dev{i:03d}" for i in range(s.devices)]
        index = {d: i for i, d in enumerate(ids)}
        model_config: dict[str, Any] = {
            "input_dim": fed.input_dim,
            "num_classes": fed.num_classes,
            "hidden_sizes": list(s.hidden_sizes),
        }
        initial = self.workdir / "initial.ursw"
        write_initial_weights(initial, model_config, seed=s.seed)

        def evaluate(round_index: int, version: int, arrays: Any) -> dict[str, Any]:
            from ursa.edge_sdk.training import evaluate as score

            result = score(ARCHITECTURE, model_config, arrays, fed.test_x, fed.test_y)
            return {
                "accuracy": result.accuracy,
                "loss": result.mean_loss,
                "per_class_accuracy": list(result.per_class_accuracy),
            }

        def on_round(record: TrainingRoundReport) -> None:
            chosen = [index[d] for d in record.selected]
            l1 = float(distance_to_uniform(dists[chosen].mean(axis=0)))
            self.telemetry.annotate_round(record.round, l1_to_uniform=l1)
            entry = _round_entry(record, l1)
            with self.lock:
                if len(self.rounds) >= s.rounds:
                    return  # FedDisk: a round after the last one, not reported
                self.rounds.append(entry)
                done = len(self.rounds)
            if done >= s.rounds:
                self.stop_service.set()
            self.progress.line(
                done,
                f"round {record.round}: acc {entry['accuracy']:.3f}, worst class "
                f"{entry['worst_class']} ({entry['worst_class_accuracy']:.2f}), "
                f"||p_o - p_u||_1 {l1:.3f}, {len(record.contributed)} updates",
            )

        made = self._made_hooks(fed) if s.weighting == "feddisk" else None
        broker, url = start_broker(s.broker_url)
        try:
            report = self._with_broker(
                url, fed, ids, model_config, initial, evaluate, on_round, made
            )
        finally:
            if broker is not None:
                broker.stop()
        report["population"] = fed.summary
        report["random_selection_l1_to_uniform"] = self._random_baseline(dists)
        report["wall_s"] = time.perf_counter() - started
        return self._finish(report, model_config, fed)

    def _with_broker(
        self,
        url: str,
        fed: Federation,
        ids: list[str],
        model_config: dict[str, Any],
        initial: Path,
        evaluate: Any,
        on_round: Any,
        made: MadeHooks | None,
    ) -> dict[str, Any]:
        from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
        from ursa.coordinator.service import CoordinatorService
        from ursa.coordinator.training import TrainingPlugin

        s = self.settings
        made_initial = made.initial if made is not None else None
        config = coordinator_config(s, self.workdir, url, initial, made_initial)
        operator = OperatorProvisioning(self.workdir / "operator", FEDERATION)
        config = config.model_copy(
            update={"trust": operator.coordinator(config.state_dir)}
        )  # a trial's setup: the operator certifies the coordinator and every device
        hooks = training_hooks(evaluate, on_round, made)
        build = training_plugin(config, hooks, self.telemetry)
        if build is None:
            raise DemoError("the demo trains: its config names a training method")
        service = CoordinatorService(
            config,
            plugin=build,
            steps=before_training_steps(config),
            telemetry=self.telemetry,
        )
        plugin = service.plugin
        classifier = plugin.classifier if isinstance(plugin, FeddiskPlugin) else plugin
        assert isinstance(classifier, TrainingPlugin)
        view = self._observe(service)
        stop = self.stop_service
        service.start()
        loop = threading.Thread(target=service.run, args=(stop,), daemon=True)
        loop.start()
        specs = [
            DeviceSpec(d, fed.devices[i].x, fed.devices[i].y, seed=1000 * s.seed + i)
            for i, d in enumerate(ids)
        ]
        processes = s.processes or s.devices
        rho, emd = fed.summary["rho"], fed.summary["emd_avg"]
        self.progress.note(
            f"{s.devices} devices in {processes} processes (rho {rho:.1f}, "
            f"EMD {emd:.2f}), K={s.k}, "
            f"selection {s.selection}, weighting {s.weighting}, {s.key_bits}-bit "
            f"keys, broker {url}"
        )
        fleet_settings = _fleet(s, url, self.workdir, model_config)
        root = fleet_settings["state_root"]
        fleet_settings["trust"] = {d: operator.device(root / d, d) for d in ids}
        if service.balancing is not None:
            from ursa.tools.demo.flicker import flicker_extra

            fleet_settings["extra"] = {
                "flicker": flicker_extra(fed.test_x, fed.test_y, fed.num_classes)
            }
        fleet = spawn_devices(specs, fleet_settings, processes)
        procs = fleet.processes
        deadline = time.monotonic() + s.timeout_s
        noted_flicker = False
        try:
            stage, enrolled = None, 0
            while loop.is_alive() and time.monotonic() < deadline:
                loop.join(1.0)
                enrolled = self._note_enrolled(service, enrolled)
                stage = self._note_stage(service, stage)
                if not noted_flicker and service.balancing is not None:
                    noted_flicker = self._note_flicker(service.balancing)
                exited = any(p.exitcode is not None for p in procs)
                if exited and not service.is_done:
                    self.progress.note("a device process exited early; stopping")
                    break
            done = service.is_done or (
                made is not None and self._classifier_rounds() >= s.rounds
            )
            if service.is_done:  # the devices save the final model, then exit
                _await_exit(procs, min(FINAL_DELIVERY_S, deadline - time.monotonic()))
        finally:
            fleet.stop.set()
            reports = wait_for_reports(fleet.results, len(ids), 60.0)
            for proc in procs:
                proc.join(10.0)
                if proc.is_alive():
                    proc.terminate()
            stop.set()
            loop.join(10.0)
            service.stop()
            if view is not None:
                view.stop()
        from ursa.tools.demo.report import report_of

        devices = sorted((report_of(r) for r in reports), key=lambda d: d["device_id"])
        out: dict[str, Any] = {}
        if service.balancing is not None:
            from ursa.tools.demo.flicker import summarise

            figures = {r.device_id: r.flicker for r in reports if r.flicker}
            out["flicker"] = summarise(service.balancing.summary(), figures)
        if isinstance(plugin, FeddiskPlugin):
            out["feddisk"] = {
                "made_rounds": plugin.made_rounds,
                "best_made_version": plugin.best_version,
                "switch_round": plugin.switch_round,
                "made": list(self.made_rounds),
                "effective_rounds": plugin.made_rounds + self._classifier_rounds(),
            }
        return out | {
            "completed": done,
            "final_model_delivered": {
                "devices": sum(r.final_model_saved for r in reports),
                "of": len(ids),
            },
            "devices": devices,
            "_final_arrays": classifier.global_arrays,
            "final_version": classifier.version,
        }

    def _observe(self, service: CoordinatorService) -> ObserveServer | None:
        """The dashboard, /api/status and /metrics (``--http``), started."""
        s = self.settings
        if s.http is None:
            return None
        from ursa.tools.observe.server import ObserveConfigError, observe_service

        try:
            view = observe_service(service, s.http, token=s.http_token)
        except ObserveConfigError as exc:
            raise DemoError(str(exc)) from None
        self.progress.note(f"dashboard, /api/status and /metrics on {view.url}")
        return view

    def _classifier_rounds(self) -> int:
        with self.lock:
            return len(self.rounds)

    def _made_hooks(self, fed: Federation) -> MadeHooks:
        """FedDisk: the global MADE's initial weights and the harness's callbacks.

        The harness scores each global MADE on the held-out test split (test
        NLL, nats per sample); the coordinator sees none of it.
        """
        from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings

        s = self.settings
        made_config = FeddiskSettings().made_model_config(fed.input_dim)
        initial = self.workdir / "made.ursw"
        write_initial_weights(initial, made_config, seed=s.seed, architecture="made")

        def evaluate(round_index: int, version: int, arrays: Any) -> dict[str, Any]:
            from ursa.edge_sdk.training import made_nll

            return {"test_nll": made_nll(made_config, arrays, fed.test_x)}

        def on_round(record: TrainingRoundReport) -> None:
            nll = float(record.metrics.get("test_nll", float("nan")))
            with self.lock:
                self.made_rounds.append(
                    {
                        "round": record.round,
                        "version": record.version,
                        "test_nll": nll,
                        "contributed": len(record.contributed),
                        "elapsed_s": record.elapsed_s,
                    }
                )
            self.progress.note(
                f"FedDisk MADE round {record.round}: version {record.version}, "
                f"test NLL {nll:.2f}, {len(record.contributed)} updates"
            )

        def on_switch(round_index: int, made_version: int) -> None:
            self.progress.note(
                f"FedDisk: MADE phase over at round {round_index} (global MADE "
                f"version {made_version}); devices weight their samples, "
                "classifier rounds follow"
            )

        return MadeHooks(initial, evaluate, on_round, on_switch)

    def _note_flicker(self, flicker: Balancing) -> bool:
        """Say how FLICKER ended, once it has; True once said."""
        if not flicker.is_over:
            return False
        section = flicker.summary()
        self.progress.note(
            f"FLICKER {section['phase']}: GI {_gi(section.get('gi_before'))} -> "
            f"{_gi(section.get('gi_after'))} ({section.get('stop_reason')}, "
            f"{len(section['resampled_devices'])} devices resampled, "
            f"{section['wall_s']:.1f} s)"
        )
        return True

    def _note_enrolled(self, service: CoordinatorService, last: int) -> int:
        """``12/20 devices enrolled`` while they start (torch imports take a while).

        A line when the count changes, and the full count once enrolment is
        over; -1 after that.
        """
        if last < 0:
            return last
        total = self.settings.devices
        if str(service.state.stage) != "enrolment":
            if last != total:
                self.progress.note(f"{total}/{total} devices enrolled")
            return -1
        count = len(service.online_devices())
        if count != last:
            self.progress.note(f"{count}/{total} devices enrolled")
        return count

    def _note_stage(self, service: CoordinatorService, last: str | None) -> str:
        """Say what the coordinator waits for, until the first round trains."""
        state = service.state
        stage = str(state.stage)
        if stage != last and state.round <= 1 and not self.rounds:
            notes = _STAGE_NOTES | (
                {"training": _TRAINING_NOTES[self.settings.weighting]}
                if self.settings.weighting in _TRAINING_NOTES
                else {}
            )
            self.progress.note(notes.get(stage, f"coordinator stage {stage}"))
        return stage

    def _finish(
        self, report: dict[str, Any], model_config: dict[str, Any], fed: Federation
    ) -> dict[str, Any]:
        from ursa.tools.demo.report import onnx_check, summarise_devices, write_report

        s = self.settings
        arrays = report.pop("_final_arrays")
        walls = {r.round: r.elapsed_s for r in self.telemetry.snapshot().rounds}
        rounds = [
            entry | {"wall_s": walls.get(int(entry["round"]))}
            for entry in sorted(self.rounds, key=lambda r: int(r["round"]))
        ]
        report["settings"] = _settings_json(s)
        report["methods"] = s.methods()
        report["rounds"] = rounds
        report["device_summary"] = summarise_devices(report["devices"])
        report["mean_l1_to_uniform"] = (
            float(np.mean([r["l1_to_uniform"] for r in rounds])) if rounds else None
        )
        last = rounds[-1] if rounds else None
        report["final_accuracy"] = None if last is None else last["accuracy"]
        report["final_accuracy_last10_mean"] = (
            float(np.mean([r["accuracy"] for r in rounds[-10:]])) if rounds else None
        )
        report["per_class_accuracy"] = (
            None if last is None else last["per_class_accuracy"]
        )
        report["federated_eval"] = federated_eval_section(rounds)
        report["worst_class"] = None if last is None else last["worst_class"]
        report["worst_class_accuracy"] = (
            None if last is None else last["worst_class_accuracy"]
        )
        check, onnx_bytes = onnx_check(ARCHITECTURE, model_config, arrays, fed.test_x)
        report["onnx_check"] = check
        report["report_dir"] = str(s.report_dir)
        write_report(report, s.report_dir, onnx_bytes)
        return report


FINAL_DELIVERY_S = 30.0
"""How long the devices get to save the final model after the last round."""


def _await_exit(procs: list[Any], within_s: float) -> None:
    """Wait (at most ``within_s``) for the device processes to exit by themselves."""
    end = time.monotonic() + max(0.0, within_s)
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))


def _gi(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _round_entry(record: TrainingRoundReport, l1: float) -> dict[str, Any]:
    metrics = dict(record.metrics)
    per_class = [float(a) for a in metrics.get("per_class_accuracy", [])]
    finite = [(a, c) for c, a in enumerate(per_class) if np.isfinite(a)]
    worst_acc, worst = min(finite) if finite else (float("nan"), -1)
    return {
        "round": record.round,
        "version": record.version,
        "accuracy": float(metrics.get("accuracy", float("nan"))),
        "loss": float(metrics.get("loss", float("nan"))),
        "per_class_accuracy": per_class,
        "worst_class": worst,
        "worst_class_accuracy": worst_acc,
        "l1_to_uniform": l1,
        "selected": list(record.selected),
        "contributed": len(record.contributed),
        "dropped": list(record.dropped),
        "dual_reporters": record.before_training.get("climb", 0),
        "federated_eval": metrics.get("federated_eval"),
        "device_metrics": metrics.get("devices"),
        "secure_aggregation": metrics.get("secure_aggregation"),
        "privacy": metrics.get("privacy"),
        "elapsed_s": record.elapsed_s,
    }


def federated_eval_section(rounds: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``report.json``'s ``federated_eval``: the fleet's accuracy on its own data.

    ``round`` is the round whose model was evaluated (the eval ran before the
    next round trained); ``server_accuracy`` is the coordinator's held-out
    accuracy of that same model, side by side.
    """
    server = {int(r["version"]): r["accuracy"] for r in rounds}
    section: dict[str, list[Any]] = {
        "round": [],
        "version": [],
        "accuracy": [],
        "per_class": [],
        "parties": [],
        "server_accuracy": [],
    }
    for entry in rounds:
        found = entry.get("federated_eval")
        if not found:
            continue
        version = int(found["version"])
        section["round"].append(int(entry["round"]) - 1)
        section["version"].append(version)
        section["accuracy"].append(found["accuracy"])
        section["per_class"].append(list(found["per_class"]))
        section["parties"].append(found["parties"])
        section["server_accuracy"].append(server.get(version))
    return section


def _fleet(
    s: TrainingDemoSettings, url: str, workdir: Path, model_config: dict[str, Any]
) -> dict[str, Any]:
    climb = {"eta_d": s.eta_d, "epsilon": s.epsilon} if s.weighting == "climb" else None
    return {
        "federation": FEDERATION,
        "broker_url": url,
        "state_root": workdir / "devices",
        "architecture": ARCHITECTURE,
        "model_config": model_config,
        "train": {"epochs": s.local_epochs, "batch_size": s.batch_size, "lr": s.lr},
        "climb": climb,
        "feddisk": {} if s.weighting == "feddisk" else None,
        "wire_dtype": s.wire_dtype,
        "selection": s.selection,
        "draw": s.draw,
        "eval_fraction": s.eval_fraction,
        "allow_plain_aggregation": s.aggregation == "plain",
        "insecure_test_keys": s.key_bits < MIN_SECURE_KEY_BITS,
    }


def _settings_json(s: TrainingDemoSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in s.__dataclass_fields__:
        if name == "http_token":
            continue  # a secret: not in the report
        value = getattr(s, name)
        out[name] = (
            str(value)
            if isinstance(value, Path)
            else list(value)
            if isinstance(value, tuple)
            else value
        )
    return out
