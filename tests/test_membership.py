"""Membership-inference audit: ROC metrics, bounds, and the attack on real models."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from fedlib.attacks.membership import (
    dp_advantage_bound,
    empirical_epsilon_lower_bound,
    gdp_advantage_bound,
    loss_threshold_attack,
    per_sample_losses,
    roc,
    yeom_advantage_bound,
)
from fedlib.data import load
from fedlib.models import build_model


def test_roc_is_monotone_from_origin_to_one():
    rng = np.random.default_rng(0)
    f, t = roc(rng.exponential(1, 300), rng.exponential(2, 200))
    assert (f[0], t[0], f[-1], t[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert (np.diff(f) >= 0).all() and (np.diff(t) >= 0).all()


def test_synthetic_no_signal_and_strong_signal():
    rng = np.random.default_rng(1)
    same = loss_threshold_attack(rng.exponential(1, 2000), rng.exponential(1, 2000), n_boot=50)
    assert same.auc == pytest.approx(0.5, abs=0.03) and same.advantage < 0.06
    assert same.ci["auc"][0] < 0.5 < same.ci["auc"][1] + 0.02
    assert empirical_epsilon_lower_bound(same) < 0.3
    apart = loss_threshold_attack(rng.exponential(0.05, 2000), rng.exponential(2, 2000), n_boot=50)
    assert apart.auc > 0.95 and apart.advantage > 0.8 and apart.tpr_at_1pct > 0.3
    assert empirical_epsilon_lower_bound(apart) > 2.0


def test_bounds():
    assert dp_advantage_bound(1.0) == pytest.approx(0.462, abs=1e-3)
    assert dp_advantage_bound(4.0) == pytest.approx(0.964, abs=1e-3)
    assert yeom_advantage_bound(1.0) == pytest.approx(1.718, abs=1e-3)  # vacuous above ln 2
    assert dp_advantage_bound(0.5) < yeom_advantage_bound(0.5)
    assert gdp_advantage_bound(1.69) == pytest.approx(0.60, abs=0.01)  # research note
    assert dp_advantage_bound(1.0, 1e-5) > dp_advantage_bound(1.0)


def test_attack_on_real_models():
    torch.manual_seed(0)
    ds = load("mnist", train_samples=64, test_samples=256, seed=0)
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(150):  # memorise 64 training images
        opt.zero_grad()
        F.cross_entropy(model(ds.x_train), ds.y_train).backward()
        opt.step()
    params = dict(model.named_parameters())
    members = per_sample_losses(model, params, ds.x_train, ds.y_train)
    unseen_a = per_sample_losses(model, params, ds.x_test[:128], ds.y_test[:128])
    unseen_b = per_sample_losses(model, params, ds.x_test[128:], ds.y_test[128:])
    overfit = loss_threshold_attack(members, unseen_b, n_boot=50)
    never = loss_threshold_attack(unseen_a, unseen_b, n_boot=50)
    # clearly above chance: the attack's advantage, max over thresholds of TPR - FPR, is the one-sided
    # two-sample Kolmogorov-Smirnov statistic of the member against the non-member losses, so its
    # p-value under no membership signal is the KS test's. The memorised model gives 1.5e-7 on one
    # thread and 9e-11 on two (other float paths); 1e-4 leaves three orders of magnitude of margin.
    # (An AUC threshold with a bootstrap interval sat within 0.001 of its limit on one thread.)
    ks = stats.ks_2samp(members, unseen_b, alternative="greater")
    assert overfit.advantage == pytest.approx(ks.statistic) and ks.pvalue < 1e-4
    # Two sets of non-members: the AUC is a Mann-Whitney statistic under its null, with standard
    # deviation sqrt((n1 + n2 + 1) / (12 n1 n2)) = 0.036 here. A band of 4.89 standard deviations
    # fails with probability 1e-6 (normal approximation) over the random split, on any machine.
    # (A 95 % interval that must contain 0.5 fails 5 % of the time by design.)
    n1 = n2 = 128
    sd = ((n1 + n2 + 1) / (12 * n1 * n2)) ** 0.5
    assert abs(never.auc - 0.5) < 4.89 * sd
