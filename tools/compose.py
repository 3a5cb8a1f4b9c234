"""One place that builds a coordinator or a device from its config.

`ursa coordinator serve`, `ursa device run`, `ursa demo`, the benchmarks and
the integration tests all build through here, so a ``[[methods]]`` list means
the same thing everywhere:

* coordinator: the training method (``fedavg``, ``fedprox``, ``climb`` or
  ``feddisk``) becomes the builder of its `RoundPlugin` (the service builds
  it with its context), made by its entry in the coordinator's method table
  (`ursa.coordinator.methods.registry`) from the hooks and initial weights
  given here; no training method, no plugin (rounds end at the selection).
  The steps the runtime runs before each round trains (CLIMB's
  `ClimbDualStep`, the federated evaluation) come from the same table
  (`before_training_steps`). The selection and balancing methods (FLICKER's
  coordinator half) are built by the runtime through the same table, with
  its context;
* device: a ``[training]`` section becomes a `TorchTrainer`, which the
  device's method table wraps as its training method needs (FedDisk's
  `FeddiskTrainer`); the device's methods (CLIMB's dual steps with its
  table's settings, ...) come from its ``[[methods]]`` list through
  `ursa.edge_sdk.methods.registry`; torch is imported only then, so a
  selection-only device and the coordinator run without it. Under
  ``kind = "flicker"`` the device's `Flicker` resamples its labels and, when
  it trains, its samples (images, with the shared ``features_file``
  extractor).

Setup problems (missing weights, data or torch, a bad setting) raise
`ServiceSetupError` with one line the commands print.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.training_hooks import RoundHooks, TrainingHooks
from ursa.tools.error_text import brief

if TYPE_CHECKING:
    from ursa.coordinator.before_training import StepBuilder
    from ursa.coordinator.clock import Clock
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.federation_end import FinalOutput
    from ursa.coordinator.plugin import PluginBuilder, PluginContext, RoundPlugin
    from ursa.coordinator.service import CoordinatorService
    from ursa.coordinator.telemetry import Telemetry
    from ursa.coordinator.training import Evaluator, TrainingRoundReport
    from ursa.edge_sdk.callbacks import DeviceCallbacks
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.config import DeviceConfig, DeviceTrainingConfig
    from ursa.edge_sdk.method import DeviceContext, MethodFactory
    from ursa.edge_sdk.methods.flicker.method import Flicker
    from ursa.edge_sdk.methods_config import DeviceMethodSpec
    from ursa.edge_sdk.trainer import Trainer
    from ursa.models.weights import Arrays
    from ursa.protocol.transport import Transport

__all__ = [
    "TRAIN_EXTRA_HINT",
    "RoundHooks",
    "ServiceSetupError",
    "TrainingHooks",
    "before_training_steps",
    "build_coordinator",
    "build_device",
    "coordinator_initial_weights",
    "device_flicker",
    "device_seed",
    "final_output",
    "load_labels",
    "load_training_data",
    "model_classes",
    "registry_of_the_model",
    "torch_trainer",
    "training_plugin",
]

logger = logging.getLogger("ursa.compose")

TRAIN_EXTRA_HINT = "needs torch: pip install 'ursa-fl[train]'"


class ServiceSetupError(ValueError):
    """A coordinator or device that cannot be built from its config (one line)."""


def before_training_steps(config: CoordinatorConfig) -> list[StepBuilder]:
    """The steps the runtime runs before each round of the training method trains.

    The training method's own (CLIMB's dual step), then the federated
    evaluation (``[evaluation] every``); none without a training method. The
    method table says which (`ursa.coordinator.methods.registry`).
    """
    from ursa.coordinator.methods.registry import before_training_steps as steps

    return list(steps(config))


def training_plugin(
    config: CoordinatorConfig,
    hooks: TrainingHooks | None = None,
    telemetry: Telemetry | None = None,
) -> PluginBuilder | None:
    """The builder of the config's training method's plugin (None without one).

    The method table makes it (`ursa.coordinator.methods.registry`); this
    gives it the hooks, the initial weights (checked against the
    architecture) and the holdout evaluator. ``telemetry`` (the service's)
    also gets every round's record.

    Raises:
        ServiceSetupError: an unusable ``[training]`` (also when the service
            calls the builder: no checkpoint yet and no usable initial weights).
    """
    from ursa.coordinator.methods.registry import TrainingInputs, training_method
    from ursa.coordinator.model_store import ModelStoreError

    if config.training_method() is None:
        return None
    hooks = _observed(hooks or TrainingHooks(), telemetry)
    classifier = hooks.classifier
    evaluate = classifier.evaluate or holdout_evaluator(config)
    inputs = TrainingInputs(
        hooks=replace(hooks, classifier=replace(classifier, evaluate=evaluate)),
        initial_weights=lambda model: coordinator_initial_weights(config, model),
    )
    try:
        build = training_method(config, inputs)
    except (ModelStoreError, OSError, ValueError) as exc:
        raise ServiceSetupError(f"[training]: {brief(exc)}") from None
    return None if build is None else _setup_errors(build)


def _setup_errors(build: Callable[[PluginContext], RoundPlugin]) -> PluginBuilder:
    """``build``, raising `ServiceSetupError` (one line) for an unusable setup."""
    from ursa.coordinator.model_store import ModelStoreError

    def built(ctx: PluginContext) -> RoundPlugin:
        try:
            return build(ctx)
        except (ModelStoreError, OSError, ValueError) as exc:
            raise ServiceSetupError(f"[training]: {brief(exc)}") from None

    return built


def coordinator_initial_weights(config: CoordinatorConfig, model: str) -> Path | None:
    """The classifier's initial weights, checked against ``[training] architecture``.

    Without an architecture: ``initial_weights`` as given. With one: its
    reference weights (seeded by ``seed``) must fit ``initial_weights`` and
    the latest checkpoint tensor by tensor; without ``initial_weights`` they
    are written to ``<state_dir>/initial-<model>.ursw`` and adopted.

    Raises:
        ServiceSetupError: an unknown architecture, missing torch, or weights
            that do not fit it (the tensor is named).
    """
    from ursa.coordinator.model_store import ModelStore, ModelStoreError, write_atomic
    from ursa.models.reference import reference_arrays
    from ursa.models.spec import ModelSpecError, check_fits
    from ursa.models.weights import WeightsError, arrays_from_bytes, arrays_to_bytes

    section = config.training_section()
    if section.architecture is None:
        return section.initial_weights
    name = f"[training] architecture {section.architecture}"
    try:
        reference = reference_arrays(
            section.architecture, section.model_options, seed=config.seed or 0
        )
    except ImportError as exc:
        raise ServiceSetupError(f"{name}: {exc} ({TRAIN_EXTRA_HINT})") from None
    except (ModelSpecError, ValueError) as exc:
        raise ServiceSetupError(f"{name}: {exc}") from None
    try:
        if section.initial_weights is not None:
            given = arrays_from_bytes(Path(section.initial_weights).read_bytes())
            check_fits(reference, given, ours_name=name, theirs_name="initial_weights")
        latest = ModelStore(config.state_dir, model).latest()
        if latest is not None:
            stored = ModelStore(config.state_dir, model).load_arrays(latest)
            check_fits(
                reference,
                stored,
                ours_name=name,
                theirs_name=f"the checkpoint v{latest.version}",
            )
    except (OSError, WeightsError, ModelStoreError) as exc:
        raise ServiceSetupError(f"[training]: {exc}") from None
    if section.initial_weights is not None:
        return section.initial_weights
    path = Path(config.state_dir) / f"initial-{model}.ursw"
    write_atomic(path, arrays_to_bytes(reference))
    return path


def holdout_evaluator(config: CoordinatorConfig) -> Evaluator | None:
    """Score each new version on ``[evaluation] holdout_file`` (None: not set).

    The coordinator's own test set: accuracy, loss and per-class accuracy in
    every round's record, next to the federated evaluation.

    Raises:
        ServiceSetupError: no ``[training] architecture``, no torch, or the
            file is unreadable.
    """
    path = config.evaluation.holdout_file
    if path is None:
        return None
    section = config.training_section()
    architecture = section.architecture
    if architecture is None:
        raise ServiceSetupError(
            "[evaluation] holdout_file needs [training] architecture (and "
            "model_options) to build the model it scores"
        )
    try:
        from ursa.edge_sdk.training import evaluate, evaluate_module
        from ursa.models.registry import build_model
        from ursa.models.spec import is_import_path
    except ImportError:
        raise ServiceSetupError(
            f"[evaluation] holdout_file {TRAIN_EXTRA_HINT}"
        ) from None
    x, y = load_training_data(path, setting="[evaluation] holdout_file")
    options = dict(section.model_options)

    def score(round_index: int, version: int, arrays: Arrays) -> dict[str, Any]:
        if is_import_path(architecture):
            result = evaluate_module(build_model(architecture, options), arrays, x, y)
        else:
            result = evaluate(architecture, options, arrays, x, y)
        return {
            "accuracy": result.accuracy,
            "loss": result.mean_loss,
            "per_class_accuracy": list(result.per_class_accuracy),
        }

    return score


def _observed(hooks: TrainingHooks, telemetry: Telemetry | None) -> TrainingHooks:
    """``hooks`` whose ``on_round`` callbacks also tell ``telemetry``."""
    if telemetry is None:
        return hooks

    def tell(own: RoundHooks) -> RoundHooks:
        callback = own.on_round

        def on_round(record: TrainingRoundReport) -> None:
            telemetry.training_round(record)
            if callback is not None:
                callback(record)

        return RoundHooks(own.evaluate, on_round)

    return TrainingHooks(tell(hooks.classifier), tell(hooks.made), hooks.on_switch)


def build_coordinator(
    config: CoordinatorConfig,
    *,
    hooks: TrainingHooks | None = None,
    transport: Transport | None = None,
    clock: Clock | None = None,
) -> CoordinatorService:
    """The coordinator service of ``config`` (training if its methods say so)."""
    from ursa.coordinator.service import CoordinatorService
    from ursa.coordinator.telemetry import Telemetry
    from ursa.crypto.errors import BackendUnavailableError, CryptoError

    config = registry_of_the_model(config)
    telemetry = Telemetry()
    plugin = training_plugin(config, hooks, telemetry)
    steps = before_training_steps(config)
    output = final_output(config)
    try:
        if clock is None:
            return CoordinatorService(
                config,
                plugin=plugin,
                steps=steps,
                transport=transport,
                final_output=output,
                telemetry=telemetry,
            )
        return CoordinatorService(
            config,
            plugin=plugin,
            steps=steps,
            transport=transport,
            clock=clock,
            final_output=output,
            telemetry=telemetry,
        )
    except BackendUnavailableError as exc:
        raise ServiceSetupError(f"[[methods]] flicker: {exc}") from None
    except CryptoError as exc:  # a key file others may read, or corrupt
        raise ServiceSetupError(str(exc)) from None


def model_classes(config: CoordinatorConfig) -> int | None:
    """The classes the federation's model outputs (None: no model, or not known).

    ``[training] model_options.num_classes`` (the built-in models name it),
    else the length of the last vector of ``[training] initial_weights``
    (the output layer's bias, last in a state dict).

    Raises:
        ServiceSetupError: the initial weights cannot be read.
    """
    from ursa.models.weights import WeightsError, arrays_from_bytes

    if config.training_method() is None:
        return None
    section = config.training_section()
    named = section.model_options.get("num_classes")
    if isinstance(named, int) and not isinstance(named, bool):
        return named
    if section.initial_weights is None:
        return None
    try:
        arrays = arrays_from_bytes(Path(section.initial_weights).read_bytes())
    except (OSError, WeightsError) as exc:
        raise ServiceSetupError(f"[training] initial_weights: {brief(exc)}") from None
    vectors = [np.shape(a)[0] for a in arrays.values() if np.ndim(a) == 1]
    return int(vectors[-1]) if vectors else None


def registry_of_the_model(config: CoordinatorConfig) -> CoordinatorConfig:
    """``config`` with Dubhe's class count taken from the model (or checked).

    A ``[registry]`` that does not name ``num_classes`` follows the model's
    output size (``groups`` and ``sigma`` with it); one that names another
    count is refused, since devices would register classes the model does
    not have.

    Raises:
        ServiceSetupError: ``[registry] num_classes`` is not the model's.
    """
    from ursa.coordinator.config import RegistryConfig

    classes = model_classes(config)
    registry = config.registry
    if classes is None or classes == registry.num_classes:
        return config
    if "num_classes" in registry.model_fields_set:
        raise ServiceSetupError(
            f"[registry] num_classes = {registry.num_classes}, but the model "
            f"outputs {classes} classes: set num_classes = {classes} (groups and "
            "sigma follow it), or leave it out"
        )
    try:
        follows = RegistryConfig(num_classes=classes, max_parties=registry.max_parties)
    except ValueError as exc:
        raise ServiceSetupError(f"[registry]: {brief(exc)}") from None
    logger.info("[registry] num_classes = %d, from the model's output size", classes)
    return config.model_copy(update={"registry": follows})


ONNX_CHECK_SAMPLES = 64
"""Random samples the final model's ONNX export is checked on against torch."""


def final_output(config: CoordinatorConfig) -> FinalOutput | None:
    """The final model's card facts and ONNX exporter (None: no architecture).

    ``[training] architecture`` names it. The exporter imports torch when
    called; without torch the card says why there is no ONNX file.

    Raises:
        ServiceSetupError: an unknown architecture or bad options.
    """
    from ursa.coordinator.federation_end import FinalOutput

    section = config.training
    if section is None or section.architecture is None:
        return None
    architecture, options = section.architecture, dict(section.model_options)
    from ursa.models.spec import is_import_path

    card: dict[str, Any] = {"name": architecture, "options": options}
    if is_import_path(architecture):  # the app's model: no known input shape
        return FinalOutput(card)
    try:
        from ursa.models.registry import ModelConfigError, parse_config
    except ImportError:  # no torch: a card without shapes, no ONNX
        return FinalOutput(card)
    try:
        parsed = parse_config(architecture, options)
    except (ModelConfigError, ValueError) as exc:
        raise ServiceSetupError(f"[training]: {exc}") from None
    card = {
        "name": architecture,
        "options": options,
        "input_shape": list(parsed.input_shape),
        "num_classes": options.get("num_classes"),
    }
    shape = parsed.input_shape

    def export(arrays: Arrays) -> tuple[bytes, Mapping[str, Any]]:
        from ursa.models.onnx_check import checked_onnx

        rng = np.random.default_rng(0)
        x = rng.standard_normal((ONNX_CHECK_SAMPLES, *shape)).astype(np.float32)
        return checked_onnx(architecture, options, arrays, x)

    return FinalOutput(card, export)


def load_labels(path: Path) -> NDArray[np.int64]:
    """Read class labels from .npy (no pickles) or whitespace/comma separated text.

    Raises:
        ValueError: not a 1-D vector of non-negative integers.
    """
    if path.suffix.lower() == ".npy":
        labels = np.load(path, allow_pickle=False)
    else:
        text = path.read_text().replace(",", " ")
        labels = np.array([int(x) for x in text.split()], dtype=np.int64)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: labels must be a 1-D vector of integers")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{path}: labels must be non-negative")
    return labels.astype(np.int64)


def load_training_data(
    data_file: str, *, setting: str = "[training] data_file"
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Local samples and labels: a ``.npz`` (``x``, ``y``) or a `load_dataset` spec.

    Raises:
        ServiceSetupError: the file is missing, unreadable or not a data set
            (the message names ``setting``, the config key it came from).
    """
    from ursa.tools.data.datasets import DatasetError
    from ursa.tools.data.loaders import load_dataset

    spec = f"npz:{data_file}" if data_file.lower().endswith(".npz") else data_file
    try:
        data = load_dataset(spec)
    except DatasetError as exc:
        raise ServiceSetupError(f"{setting}: {exc}") from None
    return data.x.astype(np.float32), data.y.astype(np.int64)


def device_seed(device_id: str) -> int:
    """A stable training seed from the device id (when the config gives none)."""
    digest = hashlib.sha256(device_id.encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def torch_trainer(
    device_id: str,
    training: DeviceTrainingConfig,
    methods: tuple[DeviceMethodSpec, ...],
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    *,
    evaluation: tuple[NDArray[np.float32], NDArray[np.int64]] | None = None,
) -> Trainer:
    """The device's trainer for its training method (imports torch).

    ``evaluation`` is the held-out split federated evaluation scores on.

    Raises:
        ServiceSetupError: torch is missing or a setting is invalid.
    """
    from ursa.edge_sdk.methods.registry import method_trainer

    try:
        from ursa.edge_sdk.module_trainer import ModuleTrainer
        from ursa.edge_sdk.torch_trainer import TorchTrainer
        from ursa.edge_sdk.training import TrainConfig
        from ursa.models.registry import ModelConfigError, build_model, parse_config
        from ursa.models.spec import is_import_path
    except ImportError:
        raise ServiceSetupError(f"[training] {TRAIN_EXTRA_HINT}") from None
    seed = device_seed(device_id) if training.seed is None else training.seed
    eval_x, eval_y = evaluation if evaluation is not None else (None, None)
    trainer: TorchTrainer | ModuleTrainer
    try:
        train = TrainConfig.model_validate(training.train)
        if is_import_path(training.architecture):
            module = build_model(training.architecture, training.model_options, seed=0)
            trainer = ModuleTrainer(
                module,
                x,
                y,
                eval_x=eval_x,
                eval_y=eval_y,
                train=train,
                model=training.model,
                wire_dtype=training.wire_dtype,
                seed=seed,
            )
        else:
            parse_config(training.architecture, training.model_options)
            trainer = TorchTrainer(
                x,
                y,
                eval_x=eval_x,
                eval_y=eval_y,
                architecture=training.architecture,
                model_config=training.model_options,
                train=train,
                model=training.model,
                wire_dtype=training.wire_dtype,
                seed=seed,
            )
    except (ModelConfigError, ValueError) as exc:
        raise ServiceSetupError(f"[training]: {brief(exc)}") from None
    return method_trainer(methods, trainer, seed)


def device_flicker(
    config: DeviceConfig,
    labels: NDArray[np.int64],
    x: NDArray[np.float32] | None = None,
) -> MethodFactory | None:
    """The factory of FLICKER's device half under ``kind = "flicker"`` (None without).

    The features file is read now; the `Flicker` is built with its device.

    Raises:
        ServiceSetupError: an unreadable ``features_file`` or unusable samples
            (the latter when the client is built).
    """
    from ursa.edge_sdk.methods.flicker.method import load_features
    from ursa.edge_sdk.methods_config import flicker_spec

    spec = flicker_spec(config.method_list())
    if spec is None:
        return None
    num_classes = spec.num_classes
    if num_classes is None and config.training is not None:
        classes = config.training.model_options.get("num_classes")
        num_classes = int(classes) if isinstance(classes, int) else None
    extractor = None
    if spec.features_file is not None and x is not None:
        try:
            extractor = load_features(spec.features_file)
        except (OSError, KeyError, ValueError) as exc:
            raise ServiceSetupError(f"[[methods]] flicker: {brief(exc)}") from None

    def build(ctx: DeviceContext) -> Flicker:
        from ursa.crypto.errors import BackendUnavailableError
        from ursa.edge_sdk.methods.flicker.method import Flicker

        try:
            return Flicker(
                ctx,
                spec,
                labels=labels,
                x=x,
                extractor=extractor,
                num_classes=num_classes,
            )
        except (ValueError, BackendUnavailableError) as exc:
            raise ServiceSetupError(f"[[methods]] flicker: {brief(exc)}") from None

    return build


def build_device(
    config: DeviceConfig,
    labels_path: Path | None = None,
    *,
    labels: NDArray[np.int64] | None = None,
    transport: Transport | None = None,
    rng: np.random.Generator | None = None,
    methods: Sequence[MethodFactory] = (),
    callbacks: DeviceCallbacks | None = None,
) -> EdgeClient:
    """The `EdgeClient` of ``config``: a trainer from ``[training]`` if set.

    A selection-only device takes its labels from ``labels`` (an app or a
    benchmark that holds them), else ``labels_path`` or ``labels_file``.
    ``methods`` are factories of the methods the app builds itself
    (`ursa.edge_sdk.method.MethodFactory`, e.g. a `Flicker` with its own
    feature extractor); each replaces the one its table builds. Without
    them, a ``kind = "flicker"`` table's `Flicker` is built over the
    device's samples and ``features_file``.
    ``callbacks`` are the app's hooks (`ursa.edge_sdk.callbacks`).

    Raises:
        ServiceSetupError: no labels, or labels given to a training device, or
            unusable training data or settings.
        ValueError: an unreadable labels file.
    """
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.methods_config import training_spec

    trains = training_spec(config.method_list())
    if config.training is None and trains is not None:
        raise ServiceSetupError(
            f"[[methods]] {trains.kind} trains: add a [training] section "
            "(data_file, model)"
        )
    if config.training is None:
        path = labels_path or config.labels_file
        if labels is None and path is None:
            raise ServiceSetupError("give --labels or labels_file (or [training])")
        if labels is None:
            labels = load_labels(Path(str(path)))
        own = _with_flicker(methods, lambda: device_flicker(config, labels))
        return EdgeClient(
            config,
            labels,
            transport=transport,
            methods=own,
            rng=rng,
            callbacks=callbacks,
        )
    if labels_path is not None or labels is not None:
        raise ServiceSetupError("a training device takes its labels from data_file")
    from ursa.edge_sdk.fleet_eval import split_for_evaluation

    training = config.training
    x, y = load_training_data(training.data_file)
    seed = device_seed(config.device_id) if training.seed is None else training.seed
    x, y, eval_x, eval_y = split_for_evaluation(x, y, training.eval_fraction, seed=seed)
    trainer = torch_trainer(
        config.device_id,
        training,
        config.method_list(),
        x,
        y,
        evaluation=(eval_x, eval_y) if len(eval_y) else None,
    )
    own = _with_flicker(methods, lambda: device_flicker(config, y, x))
    return EdgeClient(
        config,
        y,
        trainer=trainer,
        transport=transport,
        methods=own,
        rng=rng,
        callbacks=callbacks,
    )


def _with_flicker(
    own: Sequence[MethodFactory], build: Callable[[], MethodFactory | None]
) -> list[MethodFactory]:
    """The app's methods; without any, FLICKER over the device's data (if in its table).

    A factory's kind is known only once it is built, so an app that gives
    its own methods gives its `Flicker` too (else the table's is built over
    the labels alone).
    """
    if own:
        return list(own)
    flicker = build()
    return [] if flicker is None else [flicker]
