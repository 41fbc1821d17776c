"""FedAvg (McMahan, Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017, Algorithm 1).

Each sampled client runs ``E`` epochs of minibatch SGD (here with momentum and weight
decay, buffers reset every round) from the global model; the server replaces the global
model by the sample-weighted average ``sum_k n_k / n * w_k`` (written as the global model
plus the weighted average update, times a server learning rate that defaults to 1).
Everything is inherited from :class:`~fedlib.algorithms.base.Algorithm`, which *is*
FedAvg; other algorithms override the pieces that differ.
"""

from __future__ import annotations

from fedlib.algorithms.base import Algorithm


class FedAvg(Algorithm):
    """FedAvg: every piece as :class:`~fedlib.algorithms.base.Algorithm` defines it."""
    name = "fedavg"
