from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa.models.made import Made, MadeConfig, made_degrees, made_masks
from ursa.models.registry import build_model

torch.set_num_threads(1)


def _dependency(model: Made, dim: int) -> np.ndarray:
    """dep[d, j] = output parameters of dimension d depend on input j."""
    x = torch.randn(1, dim)
    jac = torch.autograd.functional.jacobian(lambda v: model(v)[0], x)[:, 0, :]
    dep = jac.abs() > 0
    if model.config.distribution == "gaussian":
        dep = dep[:dim] | dep[dim:]
    return dep.numpy()


@pytest.mark.parametrize("distribution", ["gaussian", "bernoulli"])
@pytest.mark.parametrize("ordering", ["natural", "random"])
def test_outputs_depend_only_on_earlier_inputs(
    distribution: str, ordering: str
) -> None:
    dim = 6
    config = MadeConfig(
        input_dim=dim,
        hidden_sizes=(32, 32),
        distribution=distribution,  # type: ignore[arg-type]
        ordering=ordering,  # type: ignore[arg-type]
        mask_seed=3,
    )
    torch.manual_seed(0)
    model = Made(config)
    order = np.argsort(made_degrees(config)[0])

    dep = _dependency(model, dim)

    for pos, d in enumerate(order):
        earlier = set(order[:pos].tolist())
        assert set(np.flatnonzero(dep[d]).tolist()) <= earlier
    assert dep.any()


def test_natural_ordering_first_output_is_unconditional() -> None:
    config = MadeConfig(input_dim=5, hidden_sizes=(16,))
    model = Made(config)

    dep = _dependency(model, 5)

    assert not dep[0].any()
    assert dep[4].any()


def test_masks_are_seeded() -> None:
    a = made_masks(MadeConfig(input_dim=10, hidden_sizes=(20,), mask_seed=1))
    b = made_masks(MadeConfig(input_dim=10, hidden_sizes=(20,), mask_seed=1))
    c = made_masks(MadeConfig(input_dim=10, hidden_sizes=(20,), mask_seed=2))

    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_masks_are_not_part_of_the_weights() -> None:
    model = build_model("made", {"input_dim": 8, "hidden_sizes": [16]})

    assert all("mask" not in key for key in model.state_dict())


def test_log_prob_shapes_and_bernoulli_bounds() -> None:
    model = build_model("made", {"input_dim": 8, "distribution": "bernoulli"}, seed=0)
    assert isinstance(model, Made)
    x = (torch.rand(5, 8) > 0.5).float()

    log_p = model.log_prob(x)

    assert log_p.shape == (5,)
    assert model.conditional_log_probs(x).shape == (5, 8)
    assert bool((log_p <= 0).all())
    torch.testing.assert_close(model.nll(x), -log_p.mean())


def test_gaussian_log_prob_matches_normal_density() -> None:
    model = build_model("made", {"input_dim": 3}, seed=0)
    assert isinstance(model, Made)
    x = torch.randn(4, 3)

    mean, log_std = model(x).chunk(2, dim=1)
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(x).sum(1)

    torch.testing.assert_close(model.log_prob(x), expected)


def test_training_lowers_nll_and_prefers_training_data() -> None:
    rng = np.random.default_rng(0)
    cov = np.array(
        [[1.0, 0.9, 0.0, 0.0], [0.9, 1.0, 0.0, 0.0], [0, 0, 1, 0.5], [0, 0, 0.5, 1]]
    )
    data = torch.from_numpy(rng.multivariate_normal(np.zeros(4), cov, size=256)).float()
    model = build_model("made", {"input_dim": 4, "hidden_sizes": [32]}, seed=0)
    assert isinstance(model, Made)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = float(model.nll(data).detach())

    for _ in range(150):
        optimiser.zero_grad()
        loss = model.nll(data)
        torch.autograd.backward(loss)
        optimiser.step()

    with torch.no_grad():
        after = float(model.nll(data))
        on_data = float(model.log_prob(data).mean())
        on_shifted = float(model.log_prob(data + 3.0).mean())
    assert after < before - 0.5
    assert on_data > on_shifted + 5.0


def test_sample_draws_each_dimension_from_its_conditional() -> None:
    # zero output weights: x_d ~ N(bias_mean[d], exp(bias_log_std[d]))
    config = MadeConfig(input_dim=2, hidden_sizes=(4,))
    model = Made(config)
    out = model.net[-1]
    assert isinstance(out, torch.nn.Linear)
    with torch.no_grad():
        out.weight.zero_()
        out.bias.copy_(torch.tensor([3.0, 0.0, np.log(0.5), np.log(0.1)]))

    x = model.sample(4000, torch.Generator().manual_seed(0))

    assert x.shape == (4000, 2)
    assert float(x[:, 0].mean()) == pytest.approx(3.0, abs=0.05)
    assert float(x[:, 0].std()) == pytest.approx(0.5, abs=0.05)
    assert float(x[:, 1].std()) == pytest.approx(0.1, abs=0.01)
    again = model.sample(4000, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
