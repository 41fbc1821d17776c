"""Floating-point operations of a configuration's training, counted once per shape, and the operators
one vectorized step dispatches.

A configuration's arithmetic is set by its shape (algorithm, model, batch size, DP mode, dropout,
precision) and its plan (rounds, clients per round, samples per client, local epochs, evaluated test
samples). :func:`per_sample_flops` counts, with PyTorch's own counter
(``torch.utils.flop_counter.FlopCounterMode``: matrix multiplies and convolutions, forward and
backward), one round of one client of the configuration's own algorithm on the sequential path (every
local step, its loss, gradients and update) and one evaluation, and divides by the samples they
processed; :func:`training_flops` scales that by the plan. Elementwise work (activations, the
optimizer, clipping, noise) is not counted: it is a small part of the arithmetic of these models and
adds memory traffic, not matrix throughput, which is what a FLOP rate is measured against (the
device's matrix-multiply peak, :mod:`lab.bench`).

One correction to PyTorch's counter (:func:`conv_backward_flop`): it counts a *grouped* convolution's
weight gradient as if every group saw every channel, ``groups`` times too many. Record-level DP-SGD's
per-sample convolution gradients are one grouped convolution with the samples as groups (ghost
clipping, :mod:`fedlib.privacy.ghost`; ``vmap`` of ``grad`` alike), so the uncorrected counter put a
record-level step at about seven plain steps where it computes 1.2-1.4 (issue 75).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from fedlib.config import Config


def probe_config(config: Config) -> Config:
    """The smallest run of ``config``'s shape: one client holding two minibatches, one round, one
    local epoch, the test split cut to one batch. Settings calibrated to the federation's size keep
    the original's value (adaptive clipping's count noise, ``qN / 20`` by default)."""
    from fedlib.algorithms.dp_fedavg import count_std

    b = config.batch_size
    keep = {"clip_count_std": count_std(config)} if config.algorithm == "dp_fedavg" else {}
    return config.replace(clients=1, train_samples=2 * b, test_samples=b, validation_samples=0,
                          client_fraction=1.0, local_epochs=1, partition="iid", seed=0, profile="custom",
                          **keep)


def conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                       output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
    """FLOP of ``aten.convolution_backward``: PyTorch's formula (``torch.utils.flop_counter``) for the
    input gradient, and for the weight gradient divided by ``groups``: with ``G`` groups each output
    channel correlates with ``C_in / G`` input channels, not ``C_in`` as PyTorch's formula counts (its
    own note skips groups). Shapes in, as PyTorch's registered formulas take them."""
    raw = flop_counter.conv_backward_flop.__wrapped__
    args = (grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding,
            groups)
    inp = raw(*args, [output_mask[0], False, False], out_shape)
    weight = raw(*args, [False, output_mask[1], False], out_shape)
    return inp + weight // max(1, groups)


def flop_counter_mode() -> FlopCounterMode:
    """PyTorch's FLOP counter with :func:`conv_backward_flop` for grouped convolutions' backward."""
    # (the counter wraps the formula to take shapes itself)
    return FlopCounterMode(display=False,
                           custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop})


@functools.lru_cache(maxsize=256)
def _counted(probe: Config) -> tuple[float, float]:
    from fedlib.engine import Executor
    from fedlib.experiment import Experiment, evaluate

    exp = Experiment(probe, torch.device("cpu"))
    selected, work = exp.prepare(0)
    samples = float(work.plan.weight.sum()) if selected else 0.0
    executor = Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train)
    with flop_counter_mode() as train:
        if selected:
            executor.run(work.plan, work.cstates, work.ctx)
    with flop_counter_mode() as ev:
        evaluate(exp.model, exp.gparams, exp.data.x_test, exp.data.y_test)
    per_train = train.get_total_flops() / samples if samples else math.nan
    return per_train, ev.get_total_flops() / len(exp.data.y_test)


def per_sample_flops(config: Config) -> tuple[float, float]:
    """FLOP per training sample of a local step (forward, backward and whatever else the algorithm's
    step multiplies: MOON's extra forward passes, record-level DP-SGD's per-sample gradients) and
    per evaluated test sample, for ``config``'s shape (counted once per shape, see the module)."""
    return _counted(probe_config(config).validate())


def training_flops(config: Config) -> float:
    """FLOP of training ``config``: every round, the expected sampled share of the training data
    times the local epochs, and one evaluation of the test split (``eval_every`` rounds apart)."""
    train, ev = per_sample_flops(config)
    per_round = config.n_train * config.client_fraction * config.local_epochs * train
    evaluations = math.ceil(config.rounds_run / max(1, config.eval_every))
    return config.rounds_run * per_round + evaluations * config.n_test * ev


class _OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched while active that compute (what a device would launch,
    one kernel or more each: on a GPU the per-operator cost, not arithmetic, bounds a step of these
    small models). Views (``view``, ``expand``, ``transpose``: ``OpOverload.is_view``) launch
    nothing, only describe memory, and are not counted."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _round_operators(config: Config, clients: int, runs: int, steps: int) -> int:
    from fedlib.experiment import Experiment, RunBatch

    shape = config.replace(clients=clients, train_samples=clients * config.batch_size * steps,
                           test_samples=config.batch_size, validation_samples=0, client_fraction=1.0,
                           local_epochs=1,
                           partition="iid", rounds=1, min_client_samples=1)
    batch = RunBatch([Experiment(shape.replace(seed=s), torch.device("cpu")) for s in range(runs)])
    works = [work for _, work in (e.prepare(0, off) for e, off in zip(batch.experiments, batch.offsets,
                                                                     strict=True))]
    executor = batch.executor("vectorized")
    with _OperatorCount() as counted:
        executor.run_many(works)
    return counted.count


def operators_per_step(config: Config, lanes: int, runs: int = 1) -> int:
    """ATen operators one vectorized training step of ``config``'s shape dispatches, with ``lanes``
    clients (one per lane) in each of ``runs`` runs trained as one run batch: a round of two local
    steps less a round of one (the per-round work, opening and closing clients and the clients'
    releases, cancels). A step that vectorizes fully dispatches the same operators whatever the
    lanes and runs."""
    return (_round_operators(config, lanes, runs, 2) - _round_operators(config, lanes, runs, 1))
