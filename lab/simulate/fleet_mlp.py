"""Simulation only: train many devices' MLPs at once in numpy, as `train_local` does.

`ursa simulate train` runs hundreds of rounds of 10-100 devices. On 2 cores the
device code (`ursa.edge_sdk.training.train_local`, torch) costs ~0.8 ms per
optimiser step, dominated by per-call overhead on tiny batches: 100 devices x
25 steps is ~2 s per round. This module runs the *same computation* for all of
a round's devices in one set of batched numpy matmuls (~50x faster here):

* same model: the `ursa.models.mlp.Mlp` weights (``net.<i>.weight`` of shape
  ``(out, in)``, ``net.<i>.bias``), ReLU between layers, logits out;
* same data order: each device's ``numpy.random.default_rng(seed)`` draws the
  FedVC subset and the per-epoch permutations exactly as `train_local` does;
* same loss: per-sample cross-entropy or focal loss times the sample weight
  (normalised to mean 1 over the device's data), averaged over the batch;
* same optimiser: torch's SGD rule (weight decay added to the gradient, then
  momentum with the buffer started at the first step, no dampening);
* same result: ``delta = (local - global) * delta_scale`` in float32.

`tests/lab/simulate/test_fleet_mlp.py` checks the deltas against `train_local` (to
float32 rounding). Only SGD and the MLP are covered; anything else goes
through `train_local` (the simulator's sequential trainer). Torch is not
needed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ursa.models.weights import Arrays, FloatArray
from ursa.tools.data.federation import DeviceData

if TYPE_CHECKING:
    from ursa.edge_sdk.training import TrainConfig

F32 = npt.NDArray[np.float32]
_EVAL_CHUNK = 4096


class FleetTrainingError(ValueError):
    """Inputs the vectorised trainer cannot handle (use the sequential trainer)."""


@dataclass(frozen=True)
class FleetResult:
    """What one device reports (the fields of `LocalResult` the simulator uses)."""

    delta: Arrays
    num_examples: int
    mean_train_loss: float
    num_steps: int


def layer_names(arrays: Mapping[str, FloatArray]) -> list[tuple[str, str]]:
    """The (weight, bias) names of the MLP's linear layers, input to output.

    Raises:
        FleetTrainingError: the arrays are not an `Mlp`'s.
    """
    names = list(arrays)
    if len(names) < 2 or len(names) % 2:
        raise FleetTrainingError(f"not an MLP's arrays: {names}")
    pairs = [(names[i], names[i + 1]) for i in range(0, len(names), 2)]
    for w, b in pairs:
        if not (
            w.endswith(".weight") and b.endswith(".bias") and np.ndim(arrays[w]) == 2
        ):
            raise FleetTrainingError(f"not an MLP's arrays: {names}")
    return pairs


def forward(arrays: Mapping[str, FloatArray], x: npt.ArrayLike) -> F32:
    """Logits of the MLP at ``arrays`` for flattened samples ``x`` (float32)."""
    layers = layer_names(arrays)
    data = np.asarray(x, dtype=np.float32)
    data = data.reshape(len(data), -1)
    parts = []
    for start in range(0, len(data), _EVAL_CHUNK):
        a = data[start : start + _EVAL_CHUNK]
        for i, (w, b) in enumerate(layers):
            a = a @ np.asarray(arrays[w], np.float32).T + np.asarray(
                arrays[b], np.float32
            )
            if i < len(layers) - 1:
                a = np.maximum(a, 0)
        parts.append(a)
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def cross_entropy(logits: F32, y: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Per-sample cross-entropy in nats (float64 for stable sums)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    picked = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]
    out: npt.NDArray[np.float64] = lse - picked
    return out


def train_fleet(
    global_arrays: Mapping[str, FloatArray],
    devices: Sequence[DeviceData],
    *,
    config: TrainConfig,
    seeds: Sequence[int],
    delta_scales: Sequence[float] | None = None,
) -> list[FleetResult]:
    """Train every device from ``global_arrays``; one `FleetResult` per device.

    Raises:
        FleetTrainingError: an optimiser other than SGD, a device without
            samples, or mismatched lengths.
    """
    if config.optimizer != "sgd":
        raise FleetTrainingError("the vectorised trainer implements SGD only")
    k = len(devices)
    scales = [1.0] * k if delta_scales is None else [float(s) for s in delta_scales]
    if len(seeds) != k or len(scales) != k or k == 0:
        raise FleetTrainingError("need one seed and one delta scale per device")
    layers = layer_names(global_arrays)
    x, y, w, idx, mask, counts = _plan(devices, config, seeds)
    params = {
        name: np.repeat(np.asarray(a, np.float32)[None], k, axis=0)
        for name, a in global_arrays.items()
    }
    bufs: dict[str, F32] = {}
    work: dict[str, F32] = {}
    lr = np.float32(config.lr)
    total = np.zeros(k)
    for step in range(idx.shape[1]):
        # devices with a batch at this step (all at step 0; the rest ran out)
        sub = np.flatnonzero(counts[:, step] > 0)
        full = sub.size == k
        p_sub = params if full else {n: a[sub] for n, a in params.items()}
        b_sub = bufs if full or not bufs else {n: a[sub] for n, a in bufs.items()}
        bidx, bmask = idx[sub, step], mask[sub, step]
        rows = sub[:, None]
        acts, losses = _grads(p_sub, layers, x[rows, bidx], y[rows, bidx], config)
        weights = w[rows, bidx] * bmask
        total[sub] += (losses * weights).sum(axis=1)
        scale = lr * (weights / counts[sub, step][:, None]).astype(np.float32)
        grads = _backward(p_sub, layers, acts, scale, work if full else {})
        _sgd(p_sub, b_sub, grads, config, first=step == 0)
        if not full:
            for n, a in p_sub.items():
                params[n][sub] = a
            for n, a in b_sub.items():
                bufs[n][sub] = a
    results = []
    seen = counts.sum(axis=1)
    for d in range(k):
        delta = {
            n: params[n][d] - np.asarray(a, np.float32)
            for n, a in global_arrays.items()
        }
        if scales[d] != 1.0:
            delta = {n: v * np.float32(scales[d]) for n, v in delta.items()}
        n_ex = config.fedvc_samples or len(devices[d].y)
        num_steps = int((counts[d] > 0).sum())
        results.append(FleetResult(delta, n_ex, float(total[d] / seen[d]), num_steps))
    return results


def _plan(
    devices: Sequence[DeviceData], config: TrainConfig, seeds: Sequence[int]
) -> tuple[
    F32, npt.NDArray[np.int64], F32, npt.NDArray[np.int64], F32, npt.NDArray[np.int64]
]:
    """Padded data and each device's batch schedule, drawn as `train_local` does."""
    k = len(devices)
    sizes = [len(d.y) for d in devices]
    if min(sizes) == 0:
        raise FleetTrainingError("a device has no samples")
    dim = int(np.prod(devices[0].x.shape[1:]))
    n_max, bs = max(sizes), config.batch_size
    x = np.zeros((k, n_max, dim), np.float32)
    y = np.zeros((k, n_max), np.int64)
    w = np.zeros((k, n_max), np.float32)
    schedules = []
    for d, dev in enumerate(devices):
        n = sizes[d]
        x[d, :n] = np.asarray(dev.x, np.float32).reshape(n, dim)
        y[d, :n] = dev.y
        w[d, :n] = _weights(dev.sample_weights, n)
        rng = np.random.default_rng(seeds[d])
        if config.fedvc_samples is None:
            chosen = np.arange(n)
        else:
            chosen = rng.choice(
                n, size=config.fedvc_samples, replace=n < config.fedvc_samples
            )
        batches = []
        for _ in range(config.epochs):
            order = rng.permutation(chosen)
            batches += [order[s : s + bs] for s in range(0, len(order), bs)]
        schedules.append(batches)
    steps = max(len(s) for s in schedules)
    width = max(len(b) for s in schedules for b in s)
    idx = np.zeros((k, steps, width), np.int64)
    mask = np.zeros((k, steps, width), np.float32)
    counts = np.zeros((k, steps), np.int64)
    for d, batches in enumerate(schedules):
        for s, batch in enumerate(batches):
            idx[d, s, : len(batch)] = batch
            mask[d, s, : len(batch)] = 1.0
            counts[d, s] = len(batch)
    return x, y, w, idx, mask, counts


def _weights(raw: npt.NDArray[np.float64] | None, n: int) -> F32:
    if raw is None:
        return np.ones(n, np.float32)
    arr = np.asarray(raw, dtype=np.float64)
    if (
        arr.shape != (n,)
        or not np.all(np.isfinite(arr))
        or (arr < 0).any()
        or arr.sum() <= 0
    ):
        raise FleetTrainingError("sample weights must be n finite non-negative values")
    out: F32 = (arr / arr.mean()).astype(np.float32)
    return out


def _grads(
    params: Mapping[str, F32],
    layers: list[tuple[str, str]],
    xb: F32,
    yb: npt.NDArray[np.int64],
    config: TrainConfig,
) -> tuple[list[F32], npt.NDArray[np.float64]]:
    """Forward pass; returns the activations and dl/dlogits per sample."""
    acts = [xb]
    a = xb
    for i, (wn, bn) in enumerate(layers):
        a = np.matmul(a, params[wn].transpose(0, 2, 1)) + params[bn][:, None, :]
        if i < len(layers) - 1:
            a = np.maximum(a, 0)
        acts.append(a)
    logits = acts[-1]
    z = logits - logits.max(axis=-1, keepdims=True)
    ez = np.exp(z)
    p = ez / ez.sum(axis=-1, keepdims=True)
    log_pt = np.take_along_axis(z, yb[..., None], axis=-1)[..., 0] - np.log(
        ez.sum(axis=-1)
    )
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, yb[..., None], 1.0, axis=-1)
    if config.loss == "focal":
        gamma = np.float32(config.focal_gamma)
        pt = np.exp(log_pt)
        one_minus = np.maximum(1.0 - pt, 0.0).astype(np.float32)
        losses = -(one_minus**gamma) * log_pt
        with np.errstate(divide="ignore", invalid="ignore"):
            dpow = np.where(one_minus > 0, gamma * one_minus ** (gamma - 1), 0.0)
        coef = (one_minus**gamma - dpow * pt * log_pt).astype(np.float32)
        dlogits = coef[..., None] * (p - onehot)
    else:
        losses = -log_pt
        dlogits = p - onehot
    acts.append(dlogits.astype(np.float32))
    return acts, losses.astype(np.float64)


def _backward(
    params: Mapping[str, F32],
    layers: list[tuple[str, str]],
    acts: list[F32],
    scale: F32,
    grads: dict[str, F32],
) -> dict[str, F32]:
    """Backpropagate ``scale * dl/dlogits``: lr times the batch-mean loss's gradient.

    Writes into ``grads`` when it holds arrays of the right shapes (reusing
    them: fresh multi-megabyte arrays every step cost page faults, not math).
    """
    dz = acts[-1] * scale[..., None]
    for i in range(len(layers) - 1, -1, -1):
        wn, bn = layers[i]
        a_prev = acts[i]
        if wn in grads and grads[wn].shape[0] == dz.shape[0]:
            np.matmul(dz.transpose(0, 2, 1), a_prev, out=grads[wn])
            np.sum(dz, axis=1, out=grads[bn])
        else:
            grads[wn] = np.matmul(dz.transpose(0, 2, 1), a_prev)
            grads[bn] = dz.sum(axis=1)
        if i > 0:
            dz = np.matmul(dz, params[wn]) * (a_prev > 0)
    return grads


def _sgd(
    params: Mapping[str, F32],
    bufs: dict[str, F32],
    steps: Mapping[str, F32],
    config: TrainConfig,
    *,
    first: bool,
) -> None:
    """torch.optim.SGD's step, in place, for devices that all have a batch.

    ``steps`` holds ``lr * grad`` (the learning rate is folded into the
    backward pass); the rule is torch's, ``p -= lr * (grad + wd * p)``, or with
    momentum ``b = m * b + lr * (grad + wd * p); p -= b``, to float32 rounding.
    """
    lr, wd, mom = (
        np.float32(config.lr),
        np.float32(config.weight_decay),
        config.momentum,
    )
    for name, p in params.items():
        g = steps[name]
        if not mom:
            if wd:
                p *= np.float32(1.0) - lr * wd
            p -= g
            continue
        if wd:
            g += (lr * wd) * p
        if first:
            bufs[name] = g.copy()
        else:
            buf = bufs[name]
            buf *= np.float32(mom)
            buf += g
        p -= bufs[name]


def describe(config: TrainConfig) -> dict[str, Any]:
    """The training settings a report should state (JSON-ready)."""
    return {
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "fedvc_samples": config.fedvc_samples,
        "loss": config.loss,
        "focal_gamma": config.focal_gamma,
    }
