"""Black-box privacy audits: an empirical lower bound on epsilon from a mechanism's outputs.

Run the mechanism many times on two neighbouring inputs ``D`` and ``D'`` and reduce each output
to a number (a statistic). For any event ``E`` an ``(epsilon, delta)``-DP mechanism satisfies
``P(E | D) <= e^epsilon P(E | D') + delta``, so

    ``epsilon >= ln((P(E | D) - delta) / P(E | D'))``

for every event, and likewise with ``D`` and ``D'`` swapped (Jagielski, Ullman, Oprea 2020; Nasr
et al. 2021). With finite samples the probabilities are replaced by Clopper-Pearson bounds (the
lower bound for the numerator, the upper bound for the denominator). The event is *chosen* on
one half of the samples (the best threshold on the statistic among a fixed grid of quantiles)
and *evaluated* on the other half, so the reported bound is a valid lower bound with
probability at least ``1 - alpha`` whatever the mechanism: an audit of a correct mechanism fails
(bound above the claim) with probability at most ``alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` interval for a binomial proportion (each side ``alpha / 2``)."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class AuditResult:
    """A black-box audit's outcome: the Clopper-Pearson lower bound on epsilon, the event that gives it,
    its probabilities under the two inputs and the samples drawn."""
    epsilon_lower_bound: float
    event: str  # e.g. "s > 1.3 (D over D')"
    p_numerator: float  # point estimates on the evaluation half
    p_denominator: float
    samples: int  # per input, evaluation half


def _events(s_a: np.ndarray, s_b: np.ndarray, quantiles: int) -> list[tuple[str, float]]:
    pooled = np.concatenate([s_a, s_b])
    qs = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, quantiles + 2)[1:-1]))
    return [(op, float(t)) for t in qs for op in (">", "<=")]


def _hits(s: np.ndarray, op: str, t: float) -> int:
    return int(np.count_nonzero(s > t) if op == ">" else np.count_nonzero(s <= t))


def epsilon_lower_bound(
    stat_a: np.ndarray, stat_b: np.ndarray, delta: float = 0.0, alpha: float = 1e-6, quantiles: int = 60
) -> AuditResult:
    """The audit's epsilon lower bound from scalar statistics of outputs on ``D`` (``stat_a``) and
    ``D'`` (``stat_b``); valid with probability ``1 - alpha`` (see the module docstring). The
    event's candidates: ``s > t`` and ``s <= t`` at ``quantiles`` quantiles of the pooled
    selection half, with either input in the numerator."""
    a, b = np.asarray(stat_a, dtype=np.float64), np.asarray(stat_b, dtype=np.float64)
    ha, hb = len(a) // 2, len(b) // 2
    sel_a, ev_a, sel_b, ev_b = a[:ha], a[ha:], b[:hb], b[hb:]
    best, best_score = None, -math.inf
    for op, t in _events(sel_a, sel_b, quantiles):
        pa, pb = _hits(sel_a, op, t) / len(sel_a), _hits(sel_b, op, t) / len(sel_b)
        for num, den, direction in ((pa, pb, "D over D'"), (pb, pa, "D' over D")):
            if num - delta <= 0:
                continue
            # pessimistic score on the selection half (add one hit to the denominator)
            score = math.log((num - delta) / max(den, 1.0 / len(sel_a)))
            if score > best_score:
                best, best_score = (op, t, direction), score
    if best is None:
        return AuditResult(0.0, "none", 0.0, 0.0, len(ev_a))
    op, t, direction = best
    k_a, k_b = _hits(ev_a, op, t), _hits(ev_b, op, t)
    (k_num, n_num), (k_den, n_den) = (
        ((k_a, len(ev_a)), (k_b, len(ev_b)))
        if direction == "D over D'"
        else ((k_b, len(ev_b)), (k_a, len(ev_a)))
    )
    num_lo = clopper_pearson(k_num, n_num, alpha)[0]
    den_hi = clopper_pearson(k_den, n_den, alpha)[1]
    eps = math.log((num_lo - delta) / den_hi) if num_lo - delta > 0 else 0.0
    return AuditResult(
        max(0.0, eps), f"s {op} {t:.4g} ({direction})", k_num / n_num, k_den / n_den, len(ev_a)
    )
