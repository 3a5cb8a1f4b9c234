"""The coordinator's ``[[methods]]`` list: one selection, at most one training."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from ursa.coordinator.before_training import StepContext
from ursa.coordinator.config import CoordinatorConfig, load_coordinator_config
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import (
    ClimbSpec,
    FeddiskSpec,
    FlickerSpec,
    MethodsError,
)


def _config(tmp_path: Path, methods: list[dict[str, Any]]) -> CoordinatorConfig:
    return CoordinatorConfig.model_validate(
        {"federation": "f", "state_dir": tmp_path, "methods": methods}
    )


def test_toml_methods_become_typed_specs(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'federation = "f"\nstate_dir = "s"\n'
        '[[methods]]\nkind = "dubhe"\n'
        '[[methods]]\nkind = "feddisk"\nmax_made_rounds = 7\n'
        'made_initial_weights = "made.ursw"\n'
    )
    config = load_coordinator_config(path, {})
    assert config.method_names() == ("dubhe", "feddisk")
    method = config.training_method()
    assert isinstance(method, FeddiskSpec)
    assert (method.max_made_rounds, method.made_initial_weights) == (
        7,
        Path("made.ursw"),
    )
    made = config.training_section().made_training_config(method)
    assert (made.model, made.weighting) == ("made", "fedavg")


def test_the_dubhe_draw_is_paper_unless_the_table_says_stratified(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('federation = "f"\nstate_dir = "s"\n[[methods]]\nkind = "dubhe"\n')
    assert not load_coordinator_config(path, {}).stratified_draw()
    path.write_text(path.read_text() + 'draw = "stratified"\n')
    assert load_coordinator_config(path, {}).stratified_draw()


@pytest.mark.parametrize(
    ("methods", "says"),
    [
        ([], "needs a selection method"),
        ([{"kind": "climb"}], "needs a selection method"),
        ([{"kind": "dubhe"}, {"kind": "dubhe"}], "lists dubhe more than once"),
        (
            [{"kind": "dubhe"}, {"kind": "fedavg"}, {"kind": "climb"}],
            "2 training methods (fedavg, climb); choose one",
        ),
        ([{"kind": "sgd"}], "does not match any of the expected tags"),
        ([{"kind": "dubhe", "tries": 3}], "Extra inputs are not permitted"),
        ([{"kind": "dubhe", "draw": "coins"}], "'paper' or 'stratified'"),
        (
            [{"kind": "dubhe"}, {"kind": "flicker"}, {"kind": "flicker"}],
            "lists flicker more than once",
        ),
        ([{"kind": "dubhe"}, {"kind": "flicker", "nabla": 1.5}], "nabla"),
        ([{"kind": "dubhe"}, {"kind": "flicker", "rho": 3}], "Extra inputs"),
        ([{"kind": "dubhe"}, {"kind": "climb", "dual_period": 0}], "dual_period"),
        (
            [{"kind": "dubhe"}, {"kind": "feddisk", "made_model": "classifier"}],
            "both named 'classifier'",
        ),
    ],
)
def test_unrunnable_lists_are_refused_with_one_reason(
    tmp_path: Path, methods: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        _config(tmp_path, methods)


def test_methods_error_is_a_value_error() -> None:
    # pydantic turns a ValueError raised in a validator into its error list
    assert issubclass(MethodsError, ValueError)


def test_climb_spec_fields_reach_its_dual_step(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        [{"kind": "dubhe"}, {"kind": "climb", "dual_period": 3, "max_parties": 50}],
    )
    method = config.training_method()
    assert isinstance(method, ClimbSpec)
    built = ClimbDualStep.later(method)
    step = built.build(cast(StepContext, None))  # no round runs here
    assert isinstance(step, ClimbDualStep) and built.kind is ClimbDualStep
    assert (step.spec.dual_period, step.spec.max_parties) == (3, 50)
    assert step.weighting == "climb"  # the step's, not the training config's
    training = config.training_section().training_config()
    assert training.weighting == "fedavg"


def test_flicker_is_an_optional_balancing_method_signed_with_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'federation = "f"\nstate_dir = "s"\n'
        '[[methods]]\nkind = "dubhe"\n'
        '[[methods]]\nkind = "climb"\n'
        '[[methods]]\nkind = "flicker"\nnabla = 0.2\nhop_deadline_s = 5.0\n'
    )
    config = load_coordinator_config(path, {})

    assert config.method_names() == ("dubhe", "climb", "flicker")
    assert config.balancing_method() == FlickerSpec(nabla=0.2, hop_deadline_s=5.0)
    assert isinstance(config.training_method(), ClimbSpec)
    assert _config(tmp_path, [{"kind": "dubhe"}]).balancing_method() is None
