"""DP-FedAvg: Poisson sampling, fixed and adaptive clipping, noise calibration, accounting."""

import numpy as np
import pytest
import torch

from fedlib import Config, ConfigError, run
from fedlib.algorithms import ALGORITHMS, RoundContext
from fedlib.privacy.accounting import epsilon_of_gaussian_rounds, rdp_epsilon
from fedlib.run import load_model

BASE = Config(
    algorithm="dp_fedavg",
    clients=20,
    train_samples=600,
    test_samples=300,
    rounds=2,
    partition="iid",
    dp_clip=1.0,
    dp_noise_multiplier=1.0,
    min_client_samples=5,
)


def _algo(**kw):
    return ALGORITHMS["dp_fedavg"](BASE.replace(**kw), torch.nn.Linear(1, 1))


def test_adaptive_clip_converges_to_target_quantile_without_noise():
    algo = _algo(
        adaptive_clip=True,
        dp_noise_multiplier=0.0,
        clip_count_std=1e-12,
        clip_quantile=0.7,
        dp_clip=0.1,
        clip_lr=0.2,
    )
    norms = torch.from_numpy(np.random.default_rng(0).lognormal(0.0, 0.5, size=20)).float()
    g = {"w": torch.zeros(3)}
    state = algo.init_server_state(g)
    for t in range(400):
        ctx = RoundContext(t, g, algo.hyper(t), algo.broadcast(state))
        ups = {"delta": {"w": torch.zeros(20, 3)}, "unclipped": (norms <= ctx.shared["clip"]).float()}
        _, state = algo.server_update(g, state, ups, torch.ones(20), ctx)
    frac = (norms <= state["clip"]).float().mean().item()
    assert frac == pytest.approx(0.7, abs=0.1)  # 20 norms: quantiles come in steps of 0.05
    assert float(norms.quantile(0.55)) <= float(state["clip"]) <= float(norms.quantile(0.85))


@pytest.mark.parametrize("adaptive", [False, True])
def test_noise_std_matches_calibration(adaptive):
    algo = _algo(adaptive_clip=adaptive, dp_noise_multiplier=1.0, clip_count_std=1.0, dp_clip=0.5)
    g = {"w": torch.zeros(200_000)}
    state = algo.init_server_state(g)
    ctx = RoundContext(0, g, algo.hyper(0), algo.broadcast(state))
    ups = {"delta": {"w": torch.zeros(20, 200_000)}, "unclipped": torch.ones(20)}
    new, _ = algo.server_update(g, state, ups, torch.ones(20), ctx)
    z_delta = (1.0 - 0.25) ** -0.5 if adaptive else 1.0  # (z^-2 - (2 sigma_b)^-2)^-1/2
    assert (new["w"] * 20).std().item() == pytest.approx(z_delta * 0.5, rel=0.01)


def test_poisson_sampling_rate_and_empty_rounds(tmp_path):
    algo = _algo(client_fraction=0.1)
    counts = [len(algo.sample_clients(t)) for t in range(2000)]
    assert np.mean(counts) == pytest.approx(2.0, abs=0.1)
    assert 0 in counts  # rounds with nobody happen and must work
    cfg = BASE.replace(clients=4, client_fraction=0.2, rounds=6, partition="iid")
    r = run(cfg, root=tmp_path, progress=False)
    assert len(r.history) == 6 and any(h["clients"] == 0 for h in r.history)


def test_no_noise_large_clip_full_participation_equals_fedavg(tmp_path):
    cfg = Config(clients=4, train_samples=600, test_samples=300, rounds=2, partition="iid")
    r1 = run(cfg, root=tmp_path / "a", progress=False, engine="sequential")
    r2 = run(
        cfg.replace(algorithm="dp_fedavg", dp_noise_multiplier=0.0, dp_clip=1e6),
        root=tmp_path / "b",
        progress=False,
        engine="sequential",
    )
    p1, p2 = load_model(r1, tmp_path / "a")[1], load_model(r2, tmp_path / "b")[1]
    for k in p1:  # equal client sizes: the fixed denominator equals the sample weights
        torch.testing.assert_close(p1[k], p2[k], atol=1e-5, rtol=1e-4)


def test_clipping_and_accounting_recorded(tmp_path):
    r = run(BASE.replace(client_fraction=0.5, rounds=3, dp_clip=0.01), root=tmp_path, progress=False)
    for h in r.history:
        assert h["clip"] == 0.01
    assert r.final["epsilon_spent"] == pytest.approx(rdp_epsilon([1.0] * 3, 1e-5, q=0.5))
    # integer orders only (the discrete Gaussian's guarantee): a little above dp-accounting's
    # default orders, and above the tight (PLD) value for a continuous Gaussian
    fractional = epsilon_of_gaussian_rounds([1.0] * 3, 1e-5, q=0.5, accountant="rdp")
    pld = epsilon_of_gaussian_rounds([1.0] * 3, 1e-5, q=0.5, accountant="pld")
    assert pld < fractional <= r.final["epsilon_spent"] < 1.05 * fractional
    privacy = r.meta["privacy"]
    assert (
        privacy["relation"] == "add/remove one" and privacy["unit"] == "client" and privacy["delta"] == 1e-5
    )
    assert (
        "train_loss" in privacy["diagnostic_metrics"]
        and "update_norm_median" in privacy["diagnostic_metrics"]
    )
    assert "test_acc" in privacy["released_metrics"] and "epsilon_spent" in privacy["released_metrics"]


def test_adaptive_requires_noise_split_to_exist():
    with pytest.raises(ConfigError, match="clip_count_std"):
        BASE.replace(adaptive_clip=True, dp_noise_multiplier=3.0).validate()  # sigma_b = 1: z < 2
    BASE.replace(adaptive_clip=True, dp_noise_multiplier=1.5).validate()
