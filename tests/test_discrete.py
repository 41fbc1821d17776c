"""Floating-point-safe noise: exact discrete samplers (distribution tests), the grid, Mironov's
attack on float noise (and its failure on the grid), and noise keyed on the whole config.

Statistical tests use fixed seeds; each chi-square p-value threshold (1e-4) would be crossed by
a correct sampler with probability 1e-4, and the seeds make the outcome the same on every
machine (numpy's PCG64 and its integer sampling are platform independent).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib import Config
from fedlib.algorithms import ALGORITHMS
from fedlib.algorithms.base import RoundContext
from fedlib.privacy.audit import epsilon_lower_bound
from fedlib.privacy.central import grid_sensitivity, noisy_count, noisy_sum
from fedlib.privacy.discrete import (
    Grid,
    _exact_below_exp,
    discrete_gaussian,
    discrete_laplace,
    effective_sigma,
    grid_for,
    rng_for,
)
from fedlib.privacy.guarantee import Relation


def chi2_p(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square goodness of fit on the support points with expected count >= 5 (the rest pooled)."""
    expected = pmf / pmf.sum() * len(samples)
    observed = np.array([(samples == k).sum() for k in support], dtype=np.float64)
    big = expected >= 5
    obs = np.r_[observed[big], len(samples) - observed[big].sum()]
    exp = np.r_[expected[big], len(samples) - expected[big].sum()]
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


@pytest.mark.parametrize("sigma", [0.7, 3.0, 10.0])
def test_discrete_gaussian_has_its_pmf(sigma):
    x = discrete_gaussian(200_000, sigma, rng_for(1, int(sigma * 10)))
    ks = np.arange(-int(12 * sigma) - 3, int(12 * sigma) + 4)
    s2 = effective_sigma(sigma) ** 2
    assert chi2_p(x, ks, np.exp(-(ks**2) / (2 * s2))) > 1e-4
    wrong = np.exp(-(ks**2) / (2 * (1.2 * sigma) ** 2))  # 20 % too wide: rejected
    assert chi2_p(x, ks, wrong) < 1e-6


def test_discrete_gaussian_exact_path_has_the_same_pmf():
    """Every acceptance decided by exact rational arithmetic (no float shortcut)."""
    x = discrete_gaussian(20_000, 3.0, rng_for(2), float_decides=False)
    ks = np.arange(-40, 41)
    assert chi2_p(x, ks, np.exp(-(ks**2) / (2 * effective_sigma(3.0) ** 2))) > 1e-4


@pytest.mark.parametrize("scale", [1, 4])
def test_discrete_laplace_has_its_pmf(scale):
    x = discrete_laplace(200_000, scale, rng_for(3, scale))
    ks = np.arange(-40 * scale, 40 * scale + 1)
    assert chi2_p(x, ks, np.exp(-np.abs(ks) / scale)) > 1e-4
    assert chi2_p(x, ks, np.exp(-np.abs(ks) / (1.2 * scale))) < 1e-6


def test_large_sigma_moments():
    sigma = 2.0**35
    x = discrete_gaussian(100_000, sigma, rng_for(4)).astype(np.float64) / sigma
    assert abs(x.mean()) < 5 / math.sqrt(len(x))
    n = len(x)
    lo, hi = stats.chi2.ppf([1e-5, 1 - 1e-5], n - 1)
    assert (n - 1) * x.var() / hi <= 1.0 <= (n - 1) * x.var() / lo


def test_exact_comparison_agrees_with_float_far_from_the_boundary():
    rng = np.random.default_rng(5)
    for num, den in [(1, 2), (3, 1), (7, 5), (10**30, 10**29)]:
        p = math.exp(-num / den)
        for u in (0, int(p * 2**53) - 1000, int(p * 2**53) + 1000, 2**53 - 1):
            if 0 <= u < 2**53:
                assert _exact_below_exp(u, num, den, rng) == ((u + 1) / 2**53 <= p), (num, den, u)


class ScriptedBits:
    """A stand-in generator for :func:`_exact_below_exp`'s refinement: each 64-bit word it asks for
    (as 63 bits, then 1) comes from ``words``; counts how many it gave."""

    def __init__(self, words: list[int]):
        self.halves = [h for w in words for h in (w >> 1, w & 1)]
        self.used = 0

    def integers(self, low, high):
        assert (low, high) in ((0, 2**63), (0, 2))
        self.used += 1
        return self.halves[self.used - 1]


@pytest.mark.parametrize("num, den", [(1, 2), (7, 5), (3, 1000)])
def test_exact_comparison_refines_a_uniform_that_straddles_the_boundary(num, den):
    """u = floor(p 2^53) places the uniform in the 53-bit interval that holds p = exp(-num/den): the
    answer depends on the next bits. Compared with p at 1000 bits, for the uniform's extra bits all
    0, all 1, and equal to p's own next 64 (undecided: a third word decides, just above or below p's
    bits there); each case must stop after exactly the words that decide it."""
    import mpmath

    with mpmath.workprec(1000):
        p = mpmath.exp(-mpmath.mpf(num) / den)
        u = int(mpmath.floor(p * 2**53))
        w1 = int(mpmath.floor(p * mpmath.mpf(2) ** 117)) - (u << 64)  # p's bits 54 to 117
        w2 = int(mpmath.floor(p * mpmath.mpf(2) ** 181)) - (((u << 64) | w1) << 64)
        for words, used in [([0], 2), ([2**64 - 1], 2), ([w1, 0], 4), ([w1, 2**64 - 1], 4),
                            ([w1, w2 + 1], 4), ([w1, w2 - 1], 4)]:
            rng = ScriptedBits(words)
            value, bits = u, 53
            for w in words:
                value, bits = (value << 64) | w, bits + 64
            lo, hi = mpmath.mpf(value) / mpmath.mpf(2) ** bits, mpmath.mpf(value + 1) / mpmath.mpf(2) ** bits
            assert hi < p or lo > p  # the scripted bits decide
            truth = hi < p
            assert _exact_below_exp(u, num, den, rng) == truth, (words, truth)
            assert rng.used == used
    assert w1 not in (0, 2**64 - 1) and 0 < w2 < 2**64 - 1


def test_grid_is_exact_and_sized_by_the_bound():
    g = grid_for(0.5)
    assert g.step == 2.0**-31 and 2**30 <= 0.5 / g.step < 2**31
    x = np.array([0.1, -0.3, 0.5, 1e-12])
    n = g.encode(x)
    assert np.all(np.abs(g.decode(n) - x) <= g.step / 2)
    assert np.array_equal(g.encode(g.decode(n)), n)
    assert Grid(0.25).encode(np.array([0.125, 0.375])).tolist() == [0, 2]  # ties to even
    with pytest.raises(ValueError):
        grid_for(0.0)


def test_secure_sum_is_on_the_grid_with_the_stated_std_and_masked():
    n = 200_000
    clipped = {"w": torch.zeros(3, n), "b": torch.zeros(3, 4)}
    mask = {"w": (torch.arange(n) % 2 == 0).float(), "b": torch.ones(4)}
    out = noisy_sum(clipped, 0.5, 2.0, Relation.REPLACE_ONE, (6,), mask=mask)
    step = grid_for(0.5).step
    w = out["w"].double().numpy()
    assert np.all(w[1::2] == 0)  # pruned coordinates carry no noise
    kept = w[0::2]
    assert np.all(np.round(kept / step) * step == kept)
    sigma = 2.0 * grid_sensitivity(0.5, Relation.REPLACE_ONE, n + 4, grid_for(0.5)) * step
    assert sigma == pytest.approx(2.0 * 2 * 0.5, rel=1e-4)  # z x 2C, plus rounding slack
    assert kept.std() == pytest.approx(sigma, rel=0.01)


def test_mironovs_event_separates_float_noise_but_not_grid_noise(monkeypatch):
    """Mironov (CCS 2012): with float32 noise, ``0 < out < 0.5`` with ``out`` not a multiple of
    2^-24 happens without the client and never with it (``2 + n`` for n in (-2, -1.5) is exact,
    a multiple of 2^-23), so no epsilon holds. On the grid both inputs reach the event. (Every
    coordinate carries the full sensitivity, one trial each: the noisy sum's row-norm check, which
    no real update may pass this way, is lifted.)"""
    from fedlib.privacy import central

    monkeypatch.setattr(central, "check_rows", lambda *a, **k: None)
    n = 400_000
    clip, z = 2.0, 0.5  # add/remove: sensitivity 2, noise std 1

    def event(out: torch.Tensor) -> np.ndarray:
        o = out.double()
        return ((o > 0) & (o < 0.5) & (torch.remainder(o, 2.0**-24) != 0)).numpy()

    def release(present: bool, secure: bool, t: int) -> torch.Tensor:
        rows = torch.full((1, n), clip) if present else torch.zeros(0, n)
        return noisy_sum({"w": rows}, clip, z, Relation.ADD_REMOVE, (7, t), secure=secure)["w"]

    without, with_ = event(release(False, False, 0)), event(release(True, False, 1))
    assert without.mean() > 0.03 and with_.sum() == 0  # probability 0 under one input: epsilon = inf
    without, with_ = event(release(False, True, 2)), event(release(True, True, 3))
    assert without.mean() > 0.03 and with_.mean() > 0.01  # mass under both inputs
    import dp_accounting as dpa

    claim = float(dpa.get_epsilon_gaussian(z, 1e-5))
    assert (
        epsilon_lower_bound(without.astype(float), with_.astype(float), delta=1e-5).epsilon_lower_bound
        < claim
    )


def test_noisy_count_on_the_half_grid():
    vals = torch.tensor([0.5, -0.5, 0.5])
    out = [noisy_count(vals, 1.0, (8, t)) for t in range(2000)]
    assert np.std(out) == pytest.approx(1.0, rel=0.05) and abs(np.mean(out) - 0.5) < 0.1
    assert noisy_count(vals, 0.0, (8, 0)) == 0.5


def _release(cfg: Config, t: int = 0) -> torch.Tensor:
    algo = ALGORITHMS[cfg.algorithm](cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.zeros(100_000)}
    state = algo.init_server_state(g)
    ctx = RoundContext(t, g, algo.hyper(t), algo.broadcast(state))
    ups = {"delta": {"w": torch.zeros(cfg.clients, 100_000)}, "unclipped": torch.ones(cfg.clients)}
    return algo.server_update(g, state, ups, torch.ones(cfg.clients), ctx)[0]["w"]


@pytest.mark.parametrize(
    "algorithm,field,values",
    [
        ("dp_fedavg", "dp_noise_multiplier", (1.0, 2.0)),
        ("moon_dpap", "dp_epsilon_per_round", (1.0, 4.0)),
    ],
)
def test_noise_is_independent_across_configs_and_reproducible(algorithm, field, values):
    """Two budgets at one seed draw independent noise; one config reproduces exactly."""
    base = Config(
        algorithm=algorithm, clients=4, rounds=5, dp="central" if algorithm == "moon_dpap" else "none"
    )
    a, b = (_release(base.replace(**{field: v})) for v in values)
    r = np.corrcoef(a.double().numpy(), b.double().numpy())[0, 1]
    assert abs(r) < 5 / math.sqrt(len(a))  # |r| of independent samples: sd 1/sqrt(n)
    assert torch.equal(a, _release(base.replace(**{field: values[0]})))
    assert not torch.equal(a, _release(base.replace(**{field: values[0]}), t=1))  # and per round
