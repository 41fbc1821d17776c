"""fedlib's DP-FedAvg with fixed clipping beside Flower's own DP wrappers, on the same updates.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` (and the client-side variant, whose clients
clip with Flower's ``fixedclipping_mod``) wraps FedAvg: each client's update is clipped to L2 norm C,
the strategy averages the clipped models, and Gaussian noise of std ``z C / m`` is added to the
average, ``m`` the number of sampled clients (fixed at construction). fedlib adds ``N(0, (z C)^2)``
to the *sum* of clipped updates and divides by the expected number of clients ``qN``
(:mod:`fedlib.algorithms.dp_fedavg`). The two agree when like is compared with like: every client
sampled (``q = 1``, so ``qN = m``) and uniform weights (Flower's FedAvg weights by the clients'
``num-examples``; with unequal weights its average's sensitivity would exceed C / m, which its noise
does not cover). :func:`cross_check` releases one aggregate of ``M`` synthetic updates (two under
the clip, two over it) both ways and reports the difference of the noiseless means and the noise
standard deviations; ``tests/test_flower_dp.py`` holds them to their tolerances and the Flower page
shows them.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

M, D, C = 4, 200_000, 0.5


@contextlib.contextmanager
def flower_task():
    """Flower's messages need a run id outside a running Flower app: a placeholder one."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def updates(seed: int = 0) -> np.ndarray:
    """``M`` float32 updates of dimension ``D``, norms about 0.1, 0.3, 1 and 3 (C = 0.5)."""
    rng = np.random.default_rng(seed)
    scales = np.array([0.1, 0.3, 1.0, 3.0])[:, None]
    return (rng.normal(size=(M, D)) / np.sqrt(D) * scales).astype(np.float32)


def flower_release(z: float, side: str, seed: int = 0) -> np.ndarray:
    """The new global model from Flower's wrapper (``side``: "server" or "client" clipping) around
    FedAvg with uniform weights, the global model at 0."""
    from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
        FedAvg,
    )
    from flwr.supercore.differential_privacy import compute_clip_model_update

    ups = updates(seed)
    with flower_task():
        glob = ArrayRecord({"w": Array(np.zeros(D, dtype=np.float32))})
        replies = []
        for i, u in enumerate(ups):
            req = Message(RecordDict({"arrays": glob}), dst_node_id=i + 1, message_type=MessageType.TRAIN)
            model = [u.copy()]
            if side == "client":  # what Flower's fixedclipping_mod does on the client
                compute_clip_model_update(model, [np.zeros(D, dtype=np.float32)], C)
            content = {"arrays": ArrayRecord({"w": Array(model[0])}),
                       "metrics": MetricRecord({"num-examples": 1})}  # uniform weights
            replies.append(Message(RecordDict(content), reply_to=req))
        wrapper = (DifferentialPrivacyServerSideFixedClipping if side == "server"
                   else DifferentialPrivacyClientSideFixedClipping)(FedAvg(fraction_train=1.0), z, C, M)
        if side == "server":
            wrapper.current_arrays = glob
        out, _ = wrapper.aggregate_train(1, replies)
    return out.to_numpy_ndarrays()[0].astype(np.float64)


def fedlib_release(z: float, seed: int = 0) -> np.ndarray:
    """fedlib's DP-FedAvg on the same updates: every client (q = 1), fixed denominator qN = M."""
    from fedlib import Config
    from fedlib.algorithms.base import RoundContext
    from fedlib.algorithms.dp_fedavg import DpFedAvg

    cfg = Config(algorithm="dp_fedavg", clients=M, client_fraction=1.0, dp_clip=C, dp_noise_multiplier=z,
                 seed=seed)
    algo = DpFedAvg(cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.zeros(D)}
    state = algo.init_server_state(g)
    ctx = RoundContext(0, g, algo.hyper(0), algo.broadcast(state))
    clipped, unclipped = [], []
    for u in updates(seed):
        sstate = {"params": {"w": torch.from_numpy(u)}, "steps": torch.tensor(1.0),
                  "loss_sum": torch.tensor(0.0)}
        up, _, _ = algo.client_final(sstate, {}, ctx)
        clipped.append(up["delta"]["w"])
        unclipped.append(up["unclipped"])
    uploads = {"delta": {"w": torch.stack(clipped)}, "unclipped": torch.stack(unclipped)}
    new, _ = algo.server_update(g, state, uploads, torch.ones(M), ctx)
    return new["w"].double().numpy()


def cross_check(z: float = 1.0, seed: int = 0) -> list[dict]:
    """One row per implementation: the largest difference of its noiseless aggregate from fedlib's,
    and the standard deviation and mean of its noise (its release minus the noiseless mean), beside
    the target std ``z C / M``."""
    mean = fedlib_release(0.0, seed)
    rows = []
    for name, release0, release in (
            ("fedlib DP-FedAvg", mean, lambda: fedlib_release(z, seed)),
            ("Flower, server-side clipping", flower_release(0.0, "server", seed),
             lambda: flower_release(z, "server", seed)),
            ("Flower, client-side clipping", flower_release(0.0, "client", seed),
             lambda: flower_release(z, "client", seed))):
        noise = release() - mean
        rows.append({"implementation": name, "max_mean_diff": float(np.abs(release0 - mean).max()),
                     "noise_std": float(noise.std()), "noise_mean": float(noise.mean()),
                     "target_std": z * C / M, "coordinates": D})
    return rows
