"""Loss-threshold membership inference (Yeom, Giacomelli, Fredrikson, Jha, CSF 2018).

The attacker guesses "member" when a record's loss is below a threshold; sweeping the
threshold gives the ROC curve. Reported: AUC, the advantage ``max(TPR - FPR)``, TPR at low
FPR (Carlini et al., S&P 2022) with bootstrap confidence intervals, and, beside them, what
differential privacy allows:

* tight (epsilon, delta) bound on the advantage: ``(e^eps - 1 + 2 delta) / (e^eps + 1)``
  (from ``TPR <= e^eps FPR + delta`` and ``TNR <= e^eps FNR + delta``, Kairouz et al. 2015);
* Yeom et al.'s pure-epsilon bound ``e^eps - 1`` (valid, but vacuous for eps >= ln 2);
* mu-GDP bound ``2 Phi(mu/2) - 1``;
* an empirical lower bound on epsilon from Clopper-Pearson intervals (Jagielski et al. 2020):
  ``max over thresholds of ln((TPR_lo - delta) / FPR_hi)``. From a single trained model the
  examples are not independent DP trials, so this is a heuristic audit, not a proof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn
from torch.func import functional_call


@torch.no_grad()
def per_sample_losses(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int = 500) -> np.ndarray:
    """The cross-entropy of each sample of ``(x, y)`` under ``params`` (the loss-threshold attack's score)."""
    out = [F.cross_entropy(functional_call(model, params, (x[i:i + batch_size],)), y[i:i + batch_size],
                           reduction="none") for i in range(0, len(y), batch_size)]
    return torch.cat(out).cpu().numpy()


def roc(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of the rule 'member iff loss <= tau' over every threshold tau."""
    scores = np.concatenate([-member_losses, -nonmember_losses])
    labels = np.concatenate([np.ones(len(member_losses)), np.zeros(len(nonmember_losses))])
    order = np.argsort(-scores, kind="stable")
    s, lab = scores[order], labels[order]
    distinct = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # last index of each tie group
    tp, fp = np.cumsum(lab)[distinct], np.cumsum(1 - lab)[distinct]
    tpr = np.r_[0.0, tp / max(1, lab.sum())]
    fpr = np.r_[0.0, fp / max(1, (1 - lab).sum())]
    return fpr, tpr


def auc(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> float:
    """P(member loss < non-member loss) + 1/2 P(tie): the area under the ROC curve."""
    u = stats.mannwhitneyu(nonmember_losses, member_losses, alternative="two-sided").statistic
    return float(u / (len(member_losses) * len(nonmember_losses)))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """The highest true-positive rate of an ROC curve at a false-positive rate of at most ``target``."""
    ok = fpr <= target
    return float(tpr[ok].max()) if ok.any() else 0.0


@dataclass
class AttackResult:
    """A membership-inference audit's outcome: AUC, advantage (TPR - FPR at the best threshold), TPRs at
    1 % and 0.1 % FPR, and their bootstrap intervals (``ci``)."""
    auc: float
    advantage: float
    tpr_at_1pct: float
    tpr_at_01pct: float
    ci: dict[str, tuple[float, float]]
    fpr: np.ndarray
    tpr: np.ndarray
    n_members: int
    n_nonmembers: int


def loss_threshold_attack(member_losses: np.ndarray, nonmember_losses: np.ndarray, n_boot: int = 200,
                          seed: int = 0, level: float = 0.95) -> AttackResult:
    """Run the attack on given losses; bootstrap (resampling both groups) for the CIs."""
    member_losses, nonmember_losses = np.asarray(member_losses), np.asarray(nonmember_losses)
    fpr, tpr = roc(member_losses, nonmember_losses)

    def metrics(m, n):
        f, t = roc(m, n)
        return (auc(m, n), float(np.max(t - f)), tpr_at_fpr(f, t, 0.01), tpr_at_fpr(f, t, 0.001))

    point = metrics(member_losses, nonmember_losses)
    rng = np.random.default_rng(seed)
    boots = np.array([metrics(rng.choice(member_losses, len(member_losses)),
                              rng.choice(nonmember_losses, len(nonmember_losses))) for _ in range(n_boot)])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    names = ("auc", "advantage", "tpr_at_1pct", "tpr_at_01pct")
    ci = {k: (float(np.percentile(boots[:, i], lo)), float(np.percentile(boots[:, i], hi)))
          for i, k in enumerate(names)}
    return AttackResult(*point, ci, fpr, tpr, len(member_losses), len(nonmember_losses))


# ---- what DP allows ---------------------------------------------------------------------------
def dp_advantage_bound(epsilon: float, delta: float = 0.0) -> float:
    """The tight bound on TPR - FPR of any attack against an (epsilon, delta)-DP mechanism."""
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))


def yeom_advantage_bound(epsilon: float) -> float:
    """Yeom et al.'s bound ``e^eps - 1`` for pure epsilon-DP (the DP-FL article's Claim 3)."""
    return math.expm1(epsilon)


def gdp_advantage_bound(mu: float) -> float:
    """The bound for mu-GDP (Gaussian mechanisms): ``2 Phi(mu / 2) - 1``."""
    return float(2 * stats.norm.cdf(mu / 2) - 1)


def empirical_epsilon_lower_bound(result: AttackResult, delta: float = 0.0, alpha: float = 0.05) -> float:
    """``max_tau ln((TPR_lo - delta) / FPR_hi)`` with one-sided Clopper-Pearson bounds at level
    ``1 - alpha`` (and the same for the complementary rule); 0 when nothing is certified."""
    n1, n0 = result.n_members, result.n_nonmembers
    best = 0.0
    for f, t in zip(result.fpr, result.tpr, strict=True):
        for tpr_, fpr_ in ((t, f), (1 - f, 1 - t)):  # the rule and its complement
            k1, k0 = round(tpr_ * n1), round(fpr_ * n0)
            tpr_lo = stats.beta.ppf(alpha / 2, k1, n1 - k1 + 1) if k1 > 0 else 0.0
            fpr_hi = stats.beta.ppf(1 - alpha / 2, k0 + 1, n0 - k0) if k0 < n0 else 1.0
            if tpr_lo - delta > 0 and fpr_hi > 0:
                best = max(best, math.log((tpr_lo - delta) / fpr_hi))
    return best
