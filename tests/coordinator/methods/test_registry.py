"""The coordinator's one method table: every kind, built from its table alone."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from ursa.coordinator import methods_config as specs
from ursa.coordinator.config import CoordinatorConfig, EvaluationConfig
from ursa.coordinator.fleet_eval import FleetEvaluation
from ursa.coordinator.methods.climb.dual_step import ClimbDualStep
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.methods.registry import (
    COORDINATOR_METHODS,
    EntryRole,
    StepEntry,
    TrainingHooks,
    TrainingInputs,
    before_training_steps,
    selection_method,
    training_method,
)
from ursa.coordinator.plugin import CoordinatorView, NoSteps, PluginContext, RoundPlugin
from ursa.coordinator.selection_method import SelectionContext
from ursa.coordinator.training import TrainingPlugin
from ursa.models.weights import arrays_to_bytes

UNREAD_VIEW = cast(CoordinatorView, object())
"""A view for building a plugin: it keeps it and reads it per round."""
UNREAD_CONTEXT = cast(SelectionContext, object())
"""A selection method keeps its context and reads it per round."""


def _config(tmp_path: Path, *methods: dict[str, Any], **more: Any) -> CoordinatorConfig:
    return CoordinatorConfig.model_validate(
        {
            "federation": "f",
            "state_dir": tmp_path / "c",
            "methods": [{"kind": "dubhe"}, *methods],
            **more,
        }
    )


def _inputs(tmp_path: Path, config: CoordinatorConfig) -> TrainingInputs:
    weights = tmp_path / "w.ursw"
    weights.write_bytes(arrays_to_bytes({"bias": np.zeros(10, dtype=np.float32)}))
    return TrainingInputs(
        hooks=TrainingHooks(),
        initial_weights=lambda model: weights,
    )


def _plugin(config: CoordinatorConfig, inputs: TrainingInputs) -> RoundPlugin:
    build = training_method(config, inputs)
    assert build is not None
    return build(PluginContext(UNREAD_VIEW, NoSteps()))


def test_the_table_has_every_kind_methods_may_name_and_evaluation() -> None:
    union = typing.get_args(typing.get_args(specs.MethodSpec)[0])
    kinds = {cls.model_fields["kind"].default: cls for cls in union}
    table = {kind: entry.settings for kind, entry in COORDINATOR_METHODS.items()}
    assert table == {**kinds, "evaluation": EvaluationConfig}
    for kind, cls in kinds.items():  # the entry's role is its settings class's
        assert COORDINATOR_METHODS[kind].role == cls.role, kind
    assert COORDINATOR_METHODS["evaluation"].role is EntryRole.EVALUATION
    assert isinstance(COORDINATOR_METHODS["evaluation"], StepEntry)


def test_selection_methods_are_built_from_their_table(tmp_path: Path) -> None:
    stratified = _config(tmp_path)
    stratified = stratified.model_copy(
        update={"methods": (specs.DubheSpec(draw="stratified"),)}
    )
    dubhe = selection_method(stratified, UNREAD_CONTEXT)
    assert isinstance(dubhe, DubheSelection)
    assert dubhe.private_selection  # the stratified draw's
    paper = selection_method(_config(tmp_path), UNREAD_CONTEXT)
    assert isinstance(paper, DubheSelection) and not paper.private_selection
    plain = _config(tmp_path).model_copy(update={"methods": (specs.RandomSpec(),)})
    assert isinstance(selection_method(plain, UNREAD_CONTEXT), RandomSelection)


def test_evaluation_is_a_step_only_when_its_section_asks(tmp_path: Path) -> None:
    fedavg = {"kind": "fedavg"}
    assert before_training_steps(_config(tmp_path, fedavg)) == ()
    config = _config(tmp_path, fedavg, evaluation={"every": 2})
    (step,) = before_training_steps(config)
    assert step.kind is FleetEvaluation
    # without a training method no round trains: no step runs before one
    assert before_training_steps(_config(tmp_path, evaluation={"every": 2})) == ()


def test_fedavg_weights_as_its_table_says(tmp_path: Path) -> None:
    for weights, weighting in (("examples", "fedavg"), ("equal", "equal")):
        config = _config(tmp_path, {"kind": "fedavg", "weights": weights})
        plugin = _plugin(config, _inputs(tmp_path, config))
        assert isinstance(plugin, TrainingPlugin)
        assert plugin.config.weighting == weighting
        assert plugin.methods() == ("fedavg",)


def test_fedprox_trains_fedavgs_rounds_under_its_own_name(tmp_path: Path) -> None:
    config = _config(tmp_path, {"kind": "fedprox", "mu": 0.1})
    plugin = _plugin(config, _inputs(tmp_path, config))
    assert isinstance(plugin, TrainingPlugin)
    assert plugin.config.weighting == "fedavg" and plugin.methods() == ("fedprox",)


def test_climbs_dual_step_comes_before_the_runtimes_evaluation(tmp_path: Path) -> None:
    config = _config(tmp_path, {"kind": "climb"}, evaluation={"every": 1})
    plugin = _plugin(config, _inputs(tmp_path, config))
    assert isinstance(plugin, TrainingPlugin)
    assert plugin.methods() == ("climb",)
    kinds = [step.kind for step in before_training_steps(config)]
    assert kinds == [ClimbDualStep, FleetEvaluation]


def test_feddisk_builds_its_two_phase_plugin(tmp_path: Path) -> None:
    made = tmp_path / "made.ursw"
    made.write_bytes(arrays_to_bytes({"bias": np.zeros(4, dtype=np.float32)}))
    feddisk = {"kind": "feddisk", "made_initial_weights": str(made)}
    config = _config(tmp_path, feddisk, evaluation={"every": 1})
    plugin = _plugin(config, _inputs(tmp_path, config))
    assert isinstance(plugin, FeddiskPlugin)
    assert plugin.made.config.model == "made"
    assert plugin.classifier.config.model == "classifier"
    assert [s.kind for s in before_training_steps(config)] == [FleetEvaluation]


def test_no_training_method_no_plugin(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert training_method(config, _inputs(tmp_path, config)) is None


def test_a_classifier_named_like_feddisks_made_is_refused_at_load(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="a model feddisk adds are both named 'made'"):
        _config(tmp_path, {"kind": "feddisk"}, training={"model": "made"})
