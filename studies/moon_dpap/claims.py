"""The verdict rules of the MOON-DPAP pages: each function takes a page's runs and returns its
findings (:class:`studies.claims.Finding`). Tolerances are stated here, next to the rules."""

from __future__ import annotations

import numpy as np

from studies import claims as c
from studies.claims import Finding, all_of
from studies.common import Runs
from studies.moon_dpap.settings import FIG1_METHODS, PAPER, SCALES, TABLE1_METHODS

#: How far a published accuracy may be from ours (points): the paper reports one number without a
#: spread; seed-to-seed spreads of these runs are about 1 point, so 2 points is the band.
ACC_TOLERANCE = 2.0
#: Two methods are "close" when their paired gap stays within this many points.
CLOSE_MARGIN = 2.0
#: FashionMNIST has ten balanced classes.
CHANCE = 10.0

def cut(profile: str) -> str | None:
    """Why an ordering against MOON-DPAP says little away from the paper profile (None at paper)."""
    if profile == "paper":
        return None
    rounds = SCALES[profile].caps.get("rounds", 200)
    return (f"the {profile} profile runs {rounds} of the paper's 200 rounds, and MOON-DPAP's schedules "
            "(cosine learning rate, tau and mu ramps, pruning threshold, DP schedule) depend on the "
            "number of rounds, so they run compressed")


#: Why MOON and FedAvg must coincide here: the contrastive term is weighted by mu = 0.01.
MOON_INERT = "MOON's contrastive term, weighted by the paper's mu = 0.01, changes nothing measurable here"

NAMES = {k: c.METHOD_NAMES[k]
         for k in ("fedavg", "fedprox", "scaffold", "feddyn", "moon", "ditto", "moon_dpap")}


def fig1(runs: Runs, profile: str, personal_acc: float) -> list[Finding]:
    acc = {m: runs.by_seed(m) for m in FIG1_METHODS}
    others = np.mean([acc[m] for m in FIG1_METHODS if m != "scaffold"], axis=0)
    return [
        c.number(
            "MOON-DPAP reaches 83.6 % accuracy (loss 0.44)",
            PAPER["fig1"]["moon_dpap"][0],
            acc["moon_dpap"],
            profile,
            ACC_TOLERANCE,
        ),
        c.best_of("MOON-DPAP is the best of the six methods", "moon_dpap", acc, profile, cut=cut(profile)),
        c.gap(
            "MOON-DPAP is 4.7 points above FedAvg",
            PAPER["fig1"]["fedavg_gap"],
            acc["moon_dpap"],
            acc["fedavg"],
            profile,
            ACC_TOLERANCE,
            cut=cut(profile),
        ),
        c.close(
            "MOON is close to FedAvg", acc["moon"], acc["fedavg"], CLOSE_MARGIN, profile, "MOON - FedAvg",
            inert_reason=MOON_INERT,
        ),
        c.sanity(
            "Ditto is close to FedAvg",
            f"global model identical to FedAvg's; personalised accuracy {personal_acc:.1f} %",
            "Ditto's global model trains exactly as FedAvg's, so it equals FedAvg by construction; "
            "its personal models are the informative number",
        ),
        c.ordering(
            "SCAFFOLD is much lower than the others (5+ points below their mean)",
            others - 5.0,
            acc["scaffold"],
            profile,
            "others' mean - 5 - SCAFFOLD",
            cut=cut(profile),  # the others' mean includes MOON-DPAP
        ),
    ]


def fig2(
    runs: Runs, profile: str, eps_total: float, untrained_pct: float, noise_ratio: float
) -> list[Finding]:
    clean = runs.by_seed("moon_dpap")
    dp = runs.by_seed("moon_dpap (DP, eq. 5 schedule)")
    claim = "with DP MOON-DPAP ends at 77 % accuracy (loss 0.71)"
    if profile == "smoke":
        first = c.not_evaluated(claim)
    elif c.at_chance(dp, CHANCE, untrained_pct):
        first = c.failure(
            claim,
            f"{np.mean(dp):.1f} % (chance {CHANCE:g} %), epsilon {eps_total:.2f} "
            "(delta 1e-5, replace one client)",
            f"client-level DP at epsilon_0 = 1 with 20 clients drowns the signal: the noise on the "
            f"sum is about {noise_ratio:,.0f} times the largest clipped update sum, and the model "
            "ends at chance",
        )
    else:
        first = c.number(claim, PAPER["fig2"]["dp"][0], dp, profile, ACC_TOLERANCE)
    readings = []
    for reading, name in (("client", "client-level"), ("record", "record-level")):
        by_eps = {label[1]: runs.by_seed(label) for label in runs.results
                  if isinstance(label, tuple) and len(label) == 2 and label[0] == reading}
        readings.append(c.reachable(
            f"77 % under DP at a meaningful epsilon (<= {c.MEANINGFUL_EPSILON:g}), if the DP is {name}",
            PAPER["fig2"]["dp"][0], by_eps, profile, ACC_TOLERANCE))
    # the paper gives no epsilon_0, clip norm, neighbouring relation or level of DP: these two rows
    # hold under the study's reading only (the privacy-accuracy page tries the other readings)
    reading = c.our_reading("client-level DP on the clipped update, epsilon_0 = 1 per round, "
                            "20 clients")
    cost = c.gap("DP costs about 6.6 points (83.6 → 77 %)", 6.6, clean, dp, profile, 3.0, cut=cut(profile))
    return [
        c.about(first, reading),
        *readings,
        c.about(cost, reading),
        c.not_testable(
            "the privacy guarantee of the DP curve",
            f"our epsilon_0 = 1 per round composes to epsilon = {eps_total:.2f} (delta 1e-5, replace "
            "one client)",
            "the paper states no epsilon_0, delta, clip norm, neighbouring relation or total epsilon",
        ),
    ]


def table1(runs: Runs, profile: str) -> list[Finding]:
    acc = {(m, n): runs.by_seed(f"{m}|{n}") for m in TABLE1_METHODS for n in (10, 20)}
    fewer = [
        c.ordering(
            f"{NAMES[m]}: 10 clients beat 20", acc[(m, 10)], acc[(m, 20)], profile, f"{NAMES[m]} 10 - 20",
            cut=cut(profile) if m == "moon_dpap" else None,
        )
        for m in TABLE1_METHODS
    ]
    # with 20 clients these are Fig. 1's runs, whose "best of the six" claim is counted there once
    best = c.best_of("MOON-DPAP is the best with 10 clients", "moon_dpap",
                     {m: acc[(m, 10)] for m in TABLE1_METHODS}, profile, cut=cut(profile))
    numbers = [
        c.number(f"{NAMES[m]} at 20 clients", PAPER["table1"][m][2], acc[(m, 20)], profile, ACC_TOLERANCE)
        for m in TABLE1_METHODS
    ]
    return [
        all_of("every method is more accurate with 10 clients than with 20", fewer),
        Finding("MOON-DPAP is the best method with 10 clients (with 20: Fig. 1's claim, the same runs)",
                best.ours, best.verdict, best.reason),
        all_of("Table 1's accuracies at 20 clients (40-59 %)", numbers),
        c.not_testable(
            "Table 1 and Fig. 1 describe the same setting",
            "Table 1: 58.60 % for MOON-DPAP at 20 clients; Fig. 1: 83.6 %",
            "the paper does not say what differs between the two "
            "(rounds, data, partition), so Table 1's setting cannot be rebuilt",
        ),
    ]


ABLATION_NAMES = {k: c.METHOD_NAMES[k]
                  for k in ("full", "no_dynamic_lr", "no_dropout", "no_pruning", "no_all_three")}


def table2(runs: Runs, profile: str) -> list[Finding]:
    acc = {k: runs.by_seed(k) for k in ABLATION_NAMES}
    singles = ("no_dynamic_lr", "no_dropout", "no_pruning")
    return [
        c.best_of("the full method is the most accurate variant", "full", acc, profile, cut=cut(profile)),
        all_of(
            "removing any one component lowers accuracy",
            [
                c.ordering(f"without {k}", acc["full"], acc[k], profile, f"full - {ABLATION_NAMES[k]}",
                           cut=cut(profile))
                for k in singles
            ],
        ),
        all_of(
            "removing all three is the worst variant",
            [
                c.ordering(
                    f"{k} above no_all_three",
                    acc[k],
                    acc["no_all_three"],
                    profile,
                    f"{ABLATION_NAMES[k]} - without all three",
                    cut=cut(profile),
                )
                for k in ABLATION_NAMES
                if k != "no_all_three"
            ],
        ),
        all_of(
            "Table 2's accuracies (78.8-83.7 %)",
            [
                c.number(ABLATION_NAMES[k], PAPER["table2"][k][0], acc[k], profile, ACC_TOLERANCE)
                for k in ABLATION_NAMES
            ],
        ),
    ]
