"""MADE: masked autoencoder for distribution estimation (Germain et al. 2015).

One forward pass gives every conditional ``p(x_d | x_<d)`` of an
autoregressive factorisation ``p(x) = prod_d p(x_d | x_<d)`` under an input
ordering. Connectivity follows the paper: input d has degree ``m0(d)`` (its
position in the ordering, 1..D); hidden unit k of layer l gets a degree
``m_l(k)`` drawn uniformly from ``[min m_{l-1}, D - 1]`` with a seeded
generator; a hidden weight is kept when ``m_l(k) >= m_{l-1}(k')`` and an output
weight for dimension d when ``m0(d) > m_L(k)``. Masks are non-persistent
buffers rebuilt from the config, so the weights sent over the wire are only
the ordinary weights and biases.

Outputs per dimension:
  * ``gaussian`` (continuous inputs): mean and log-std, the log-std clamped to
    ``[min_log_std, max_log_std]`` so that constant pixels (e.g. the blank
    border of digits) give a bounded density instead of an infinite one;
  * ``bernoulli`` (binarised inputs in [0, 1]): one logit.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from torch import nn

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class MadeConfig(BaseModel):
    """Shape, output distribution and mask seed of a `Made`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_dim: int = Field(ge=2)
    hidden_sizes: tuple[PositiveInt, ...] = Field(default=(100,), min_length=1)
    distribution: Literal["gaussian", "bernoulli"] = "gaussian"
    ordering: Literal["natural", "random"] = "natural"
    mask_seed: int = Field(default=0, ge=0)
    min_log_std: float = -5.0
    max_log_std: float = 3.0

    @model_validator(mode="after")
    def _check_log_std(self) -> MadeConfig:
        if self.min_log_std >= self.max_log_std:
            raise ValueError("min_log_std must be below max_log_std")
        return self

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one (flattened) input sample."""
        return (self.input_dim,)


def made_degrees(config: MadeConfig) -> list[np.ndarray]:
    """Return the degrees of the input layer followed by each hidden layer."""
    rng = np.random.default_rng(config.mask_seed)
    dim = config.input_dim
    if config.ordering == "natural":
        inputs = np.arange(1, dim + 1)
    else:
        inputs = rng.permutation(dim) + 1
    degrees = [inputs]
    for size in config.hidden_sizes:
        low = min(int(degrees[-1].min()), dim - 1)
        degrees.append(rng.integers(low, dim, size=size))  # in [low, dim - 1]
    return degrees


def made_masks(config: MadeConfig) -> list[np.ndarray]:
    """Return the (out, in) 0/1 masks of the hidden layers and the output layer."""
    degrees = made_degrees(config)
    masks = [
        (degrees[i + 1][:, None] >= degrees[i][None, :]).astype(np.float32)
        for i in range(len(degrees) - 1)
    ]
    masks.append((degrees[0][:, None] > degrees[-1][None, :]).astype(np.float32))
    return masks


class MaskedLinear(nn.Linear):
    """Linear layer whose weight is multiplied by a fixed 0/1 mask."""

    mask: torch.Tensor

    def __init__(self, mask: np.ndarray) -> None:
        out_features, in_features = mask.shape
        super().__init__(in_features, out_features)
        self.register_buffer("mask", torch.from_numpy(mask), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the masked affine map."""
        return F.linear(x, self.weight * self.mask, self.bias)


class Made(nn.Module):
    """MADE density model over flattened inputs of ``input_dim`` values."""

    def __init__(self, config: MadeConfig) -> None:
        super().__init__()
        self.config = config
        masks = made_masks(config)
        layers: list[nn.Module] = []
        for mask in masks[:-1]:
            layers += [MaskedLinear(mask), nn.ReLU()]
        out_mask = masks[-1]
        if config.distribution == "gaussian":
            out_mask = np.concatenate([out_mask, out_mask], axis=0)
        layers.append(MaskedLinear(out_mask))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the raw outputs: ``(n, 2D)`` mean|log-std or ``(n, D)`` logits."""
        out: torch.Tensor = self.net(x.reshape(x.shape[0], -1))
        return out

    def conditional_log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``log p(x_d | x_<d)`` per sample and dimension, shape ``(n, D)``."""
        x = x.reshape(x.shape[0], -1)
        out = self.forward(x)
        if self.config.distribution == "bernoulli":
            return -F.binary_cross_entropy_with_logits(out, x, reduction="none")
        mean, log_std = out.chunk(2, dim=1)
        log_std = log_std.clamp(self.config.min_log_std, self.config.max_log_std)
        z = (x - mean) * torch.exp(-log_std)
        return -0.5 * z * z - log_std - _HALF_LOG_2PI

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``n`` samples, one dimension at a time in the input ordering.

        D forward passes: dimension d's conditional only depends on the
        dimensions before it, which are filled in by then.
        """
        dim = self.config.input_dim
        order = np.argsort(made_degrees(self.config)[0], kind="stable")
        x = torch.zeros(n, dim)
        with torch.no_grad():
            for d in order.tolist():
                out = self.forward(x)
                if self.config.distribution == "bernoulli":
                    p = torch.sigmoid(out[:, d])
                    x[:, d] = torch.bernoulli(p, generator=generator)
                    continue
                mean, log_std = out[:, d], out[:, dim + d]
                cfg = self.config
                log_std = log_std.clamp(cfg.min_log_std, cfg.max_log_std)
                noise = torch.randn(n, generator=generator)
                x[:, d] = mean + torch.exp(log_std) * noise
        return x

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``log p(x)`` per sample, shape ``(n,)``."""
        return self.conditional_log_probs(x).sum(dim=1)

    def nll(self, x: torch.Tensor) -> torch.Tensor:
        """Return the mean negative log-likelihood over the batch (a scalar)."""
        return -self.log_prob(x).mean()
