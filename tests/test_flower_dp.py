"""fedlib's DP-FedAvg with fixed clipping against Flower's own DP wrappers, on the same updates.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` (and the client-side variant, whose clients
clip with Flower's ``fixedclipping_mod``) wraps FedAvg: each client's update is clipped to L2 norm C,
the strategy averages the clipped models, and Gaussian noise of std ``z C / m`` is added to the
average, ``m`` the number of sampled clients (fixed at construction). fedlib adds ``N(0, (z C)^2)`` to
the *sum* of clipped updates and divides by the expected number of clients ``qN``. The two agree when
like is compared with like: every client sampled (``q = 1``, so ``qN = m``) and uniform weights
(Flower's FedAvg weights by the clients' ``num-examples``; with unequal weights its average's
sensitivity would exceed C / m, which its noise does not cover). Then the deterministic part (the
mean clipped update) is the same to float32 rounding, and both noises have std ``z C / m``: tested on
200,000 coordinates, where the sample std's relative standard error is 1/sqrt(2n) = 0.16 %, so a 1 %
margin is six standard errors (a false failure about once in 10^9 runs). fedlib's noise is the
floating-point-safe discrete Gaussian (std ``z`` times the grid-rounded sensitivity, 1e-6 above zC);
Flower's is float Gaussian noise from numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower extra is not installed (make test installs it)")

from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.differential_privacy import compute_clip_model_update  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlib import Config  # noqa: E402
from fedlib.algorithms.base import RoundContext  # noqa: E402
from fedlib.algorithms.dp_fedavg import DpFedAvg  # noqa: E402

M, D, C = 4, 200_000, 0.5


@pytest.fixture(autouse=True)
def _task_identity():
    """Flower's messages need a run outside a running Flower app."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _updates(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.array([0.1, 0.3, 1.0, 3.0])[:, None]  # two clients under the clip, two over it
    return (rng.normal(size=(M, D)) / np.sqrt(D) * scales).astype(np.float32)


def flower_release(z: float, side: str, seed: int = 0) -> np.ndarray:
    """The new global model from Flower's wrapper around FedAvg (uniform weights), global at 0."""
    ups = _updates(seed)
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
    cfg = Config(algorithm="dp_fedavg", clients=M, client_fraction=1.0, dp_clip=C, dp_noise_multiplier=z,
                 seed=seed)
    algo = DpFedAvg(cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.zeros(D)}
    state = algo.init_server_state(g)
    ctx = RoundContext(0, g, algo.hyper(0), algo.broadcast(state))
    clipped, unclipped = [], []
    for u in _updates(seed):
        sstate = {"params": {"w": torch.from_numpy(u)}, "steps": torch.tensor(1.0),
                  "loss_sum": torch.tensor(0.0)}
        up, _, _ = algo.client_final(sstate, {}, ctx)
        clipped.append(up["delta"]["w"])
        unclipped.append(up["unclipped"])
    uploads = {"delta": {"w": torch.stack(clipped)}, "unclipped": torch.stack(unclipped)}
    new, _ = algo.server_update(g, state, uploads, torch.ones(M), ctx)
    return new["w"].double().numpy()


@pytest.mark.parametrize("side", ["server", "client"])
def test_without_noise_both_release_the_mean_clipped_update(side):
    ours, theirs = fedlib_release(0.0), flower_release(0.0, side)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)  # float32 rounding of ~1e-4 values


@pytest.mark.parametrize("side", ["server", "client"])
def test_both_noises_have_std_z_c_over_m(side):
    z = 1.0
    mean = fedlib_release(0.0)
    for release in (fedlib_release(z), flower_release(z, side)):
        noise = release - mean
        assert noise.std() == pytest.approx(z * C / M, rel=0.01)
        assert abs(noise.mean()) < 6 * z * C / M / np.sqrt(D)
