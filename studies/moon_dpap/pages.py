"""The configurations each MOON-DPAP page runs (labelled, one config per seed), as functions of
the profile and the page's parameters. The notebooks run them; the campaign
(``python -m lab.campaign``) collects them through :data:`PAGES`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedlib.algorithms.moon_dpap import noise_multipliers, total_epsilon
from fedlib.config import Config
from studies.claims import seeds_at_chance
from studies.common import ConfigSet, Needs, Runs, committed_runs, seeds_for
from studies.moon_dpap.settings import (
    ABLATIONS,
    FIG1_METHODS,
    PAPER_GRID,
    PAPER_GRID_ROUNDS,
    PAPER_GRID_SEED,
    PAPER_VALIDATION,
    RECORD_GRID,
    RECORD_GRID_EPSILON,
    RECORD_TUNED,
    RECORD_TUNED_PAPER,
    RECORD_VALIDATION,
    SCALES,
    TABLE1_METHODS,
    config_for,
)

#: The DP setting of Fig. 2 (our choices: the paper gives none).
FIG2_DP = dict(dp="central", dp_clip=0.5, dp_delta=1e-5, dp_schedule="paper")


def _seeds(profile: str, n_seeds: int | None) -> list[int]:
    return seeds_for(SCALES, profile, n_seeds)


def fig1(profile: str, n_seeds: int | None = None) -> ConfigSet:
    return {m: [config_for(m, profile, s) for s in _seeds(profile, n_seeds)] for m in FIG1_METHODS}


def fig2_schedule(profile: str, eps0: float = 1.0, clip: float = 0.5) -> tuple[Config, list[float], float]:
    """The eq. 5 config (seed 0), its noise multipliers z_t and the total epsilon they spend."""
    cfg = config_for("moon_dpap", profile, 0, **{**FIG2_DP, "dp_clip": clip, "dp_epsilon_per_round": eps0})
    zs = noise_multipliers(cfg)
    return cfg, zs, total_epsilon(zs, cfg.dp_delta)


#: The formula in circulation (issue 63): per-sample clip C, eq. 4 noise with Delta_f = 2 lr C / n_i added by
#: each client to its update, the eq. 5 schedule (fedlib.algorithms.moon_dpap, dp="formula"). C = 10: the
#: default clip of the widely copied implementations of this formula (the paper gives none).
FORMULA_DP = dict(dp="formula", dp_clip=10.0, dp_delta=1e-5, dp_schedule="paper", dp_grad="ghost")
#: Fig. 2's labels of its readings' runs.
CENTRAL = "moon_dpap (DP, eq. 5 schedule)"
FORMULA = "moon_dpap (formula in circulation)"
#: The formula's control (issue 74): the same per-sample clip and path, no noise: what the clip alone costs.
FORMULA_NOISE_OFF = "moon_dpap (formula's clip, no noise)"
RECORD_TUNED_LABEL = "moon_dpap (record-level, tuned)"
#: At ``paper``: the record-level runs at the quick grid's choice, which collapsed there (issue 74), kept
#: beside the runs at the paper grid's choice so that a reader sees what tuning at the horizon changed.
RECORD_QUICK_CHOICE_LABEL = "moon_dpap (record-level, quick grid's choice)"
#: Record-level DP-SGD with each client's own sigma (issue 74; ``dp_sigma = per_client``): a labelled variant
#: beside the one-sigma runs, at the same setting and budget. It grades no claim.
RECORD_PER_CLIENT_LABEL = "moon_dpap (record-level, tuned, sigma per client)"


def grid_profile(profile: str) -> str:
    """The profile the record-level tuning grid runs at: quick (smoke in the tests)."""
    return "smoke" if profile == "smoke" else "quick"


def record_grid(profile: str) -> ConfigSet:
    """Record-level DP-SGD's (lr, C) grid on a validation hold-out (:data:`~studies.moon_dpap.settings.
    RECORD_GRID`), seed 0, at :func:`grid_profile`: labels ``("grid", lr, C)``. Never the test set."""
    at = grid_profile(profile)
    hold = RECORD_VALIDATION if at != "smoke" else 100
    return {("grid", lr, clip): [config_for("moon_dpap", at, 0, **tuned_dp(lr, clip)).replace(
        test_samples=0, validation_samples=hold)]
        for lr in RECORD_GRID["lr"] for clip in RECORD_GRID["dp_clip"]}


def paper_grid(profile: str) -> ConfigSet:
    """Record-level DP-SGD's (lr, C) grid at the horizon it runs (:data:`~studies.moon_dpap.settings.
    PAPER_GRID`): the ``paper`` profile's 200-round schedule, its first ``PAPER_GRID_ROUNDS`` rounds trained,
    on the training set less a validation hold-out it is evaluated on (never the test set), at
    ``PAPER_GRID_SEED``'s partition. Labels ``("paper grid", lr, C)``. At ``smoke`` the same shape in
    seconds (1 round of the smoke schedule's 2, one (lr, C)), so that the page's code runs in the tests."""
    if profile == "smoke":
        smoke = config_for("moon_dpap", "smoke", 0, **tuned_dp(0.05, 1.0))
        return {("paper grid", 0.05, 1.0): [
            smoke.replace(test_samples=0, validation_samples=100, train_rounds=1)]}
    return {("paper grid", lr, clip): [
        config_for("moon_dpap", "paper", PAPER_GRID_SEED, **tuned_dp(lr, clip)).replace(
            test_samples=0, validation_samples=PAPER_VALIDATION, train_rounds=PAPER_GRID_ROUNDS)]
        for lr in PAPER_GRID["lr"] for clip in PAPER_GRID["dp_clip"]}


def is_tuning_label(label) -> bool:
    """Whether ``label`` is a point of a record-level tuning grid (:func:`record_grid`,
    :func:`paper_grid`): one seed on a validation hold-out, which tunes a setting and grades no claim."""
    return isinstance(label, tuple) and bool(label) and label[0] in ("grid", "paper grid")


def paper_grid_runs() -> Runs:
    """The paper grid's committed results (:func:`paper_grid`), loaded, never trained: a page rendered at
    a smaller profile shows what the campaign has trained of it (labels with a result only)."""
    return committed_runs(paper_grid("paper"))


def quick_choice_at_paper() -> str:
    """What the quick grid's choice did at ``paper`` (issue 74), in words from its committed runs
    (:data:`RECORD_QUICK_CHOICE_LABEL`): its setting, how many seeds collapsed and the weights' norm at
    the end (plain text: it is glued into the page's prose)."""
    label = RECORD_QUICK_CHOICE_LABEL
    runs = committed_runs({label: fig2("paper")[label]})
    if label not in runs.results:
        return "the quick grid's choice is not trained at the paper's scale yet"
    rs = runs.results[label]
    bad = [r for r in rs if collapse_of(r)["rounds"]]
    norms = [r.history[-1].get("weight_norm") for r in rs if r.history[-1].get("weight_norm")]
    c = rs[0].config
    return (f"at the quick grid's choice (learning rate {c.lr:g}, C = {c.dp_clip:g}) "
            + (f"the weights reached norm {min(norms):.0f}-{max(norms):.0f} over {c.rounds_run} rounds and "
               if norms else "")
            + f"{len(bad)} of {len(rs)} seeds collapsed to a model that predicts one class")


def collapse_of(result) -> dict:
    """A run's collapse to a constant predictor (:func:`fedlib.results.collapse`), from its record, or
    for results written before they recorded it: the evaluated rounds with every representation unit
    dead (``dead_units`` 1), else with the accuracy at exactly one class's share of a balanced
    evaluation set (chance; 1/10 here)."""
    from fedlib.results import collapse

    if "collapse" in result.meta:
        return result.meta["collapse"]
    if any("predicted_classes" in h for h in result.history):
        return collapse(result.history)
    if any("dead_units" in h for h in result.history):
        rounds = [h["round"] for h in result.history if h.get("dead_units") == 1.0]
    else:
        rounds = [h["round"] for h in result.history if h.get("test_acc") is not None
                  and abs(h["test_acc"] - 0.1) < 1e-12]
    return {"rounds": len(rounds), "first_round": rounds[0] if rounds else None}


def paper_grid_table(runs: Runs) -> pd.DataFrame:
    """The paper grid (:func:`paper_grid`) in ``runs``: per (lr, C), the noise it runs under (lr sigma
    C / B per step; sigma and the rounds are the grid's, :func:`paper_grid_context`), its validation
    accuracy at its last round and at its best, its weights' norm and dead units at the end, and whether
    it collapsed (rounds predicting one class, from which); the choice (:func:`paper_grid_choice`)
    marked."""
    rows = []
    for label, rs in runs.results.items():
        if not (isinstance(label, tuple) and label and label[0] == "paper grid"):
            continue
        r = rs[0]
        evaluated = [h for h in r.history if h.get("test_acc") is not None]
        sigma = r.history[0].get("noise_multiplier", float("nan"))
        col = collapse_of(r)
        rows.append({"learning rate": label[1], "clip C": label[2],
                     "noise per step (lr sigma C / B)": label[1] * sigma * label[2] / r.config.batch_size,
                     "validation accuracy (%)": 100 * evaluated[-1]["test_acc"],
                     "best (%)": 100 * max(h["test_acc"] for h in evaluated),
                     "weight norm": evaluated[-1].get("weight_norm", float("nan")),
                     "dead units (%)": 100 * evaluated[-1].get("dead_units", float("nan")),
                     "collapsed rounds": col["rounds"],
                     "collapse": f"from round {col['first_round']}" if col["first_round"] else "none"})
    if not rows:
        return pd.DataFrame(rows)
    table = pd.DataFrame(rows).sort_values(["learning rate", "clip C"]).reset_index(drop=True)
    choice = paper_grid_choice(table)
    table["chosen"] = [(row["learning rate"], row["clip C"]) == choice for _, row in table.iterrows()]
    return table


#: The paper grid's rule: the highest validation accuracy at its last round among the settings that never
#: collapsed to a constant predictor (a collapse does not come back, so a collapsed setting is out).
PAPER_GRID_RULE = ("the highest validation accuracy at the grid's last round among the settings that never "
                   "collapsed to a constant predictor")


def paper_grid_context(runs: Runs) -> str:
    """What every run of the paper grid shares, in words: its sigma and the rounds it trains of the run."""
    rs = [rs[0] for label, rs in runs.results.items() if isinstance(label, tuple) and label
          and label[0] == "paper grid"]
    if not rs:
        return ""
    r = rs[0]
    return (f"Every setting trains the first {r.config.rounds_run} of the run's {r.config.rounds} rounds at "
            f"sigma = {r.history[0].get('noise_multiplier', float('nan')):.3g} (epsilon "
            f"{r.config.dp_epsilon_total:g} over the whole run, delta {r.config.dp_delta:g}).")


def paper_grid_choice(table: pd.DataFrame) -> tuple[float, float] | None:
    """The (lr, C) :data:`PAPER_GRID_RULE` picks in :func:`paper_grid_table`; None when every setting
    collapsed."""
    ok = table[table["collapsed rounds"] == 0]
    if ok.empty:
        return None
    best = ok.loc[ok["validation accuracy (%)"].idxmax()]
    return float(best["learning rate"]), float(best["clip C"])


#: The formula's clip swept at quick with its noise on and off (issue 74): what C costs without noise, and
#: what the noise adds at each C. C = 10 with noise is the formula reading's own run.
FORMULA_CLIPS = (1.0, 10.0, 100.0)


def formula_sweep(profile: str, n_seeds: int | None = None, eps0: float = 1.0) -> ConfigSet:
    """Labels ``("formula C", C, noise)``: the formula in circulation at clip ``C``, with its noise (True)
    or without (False), at ``profile``'s seeds."""
    return {("formula C", clip, noise): [
        config_for("moon_dpap", profile, s, **{**FORMULA_DP, "dp_clip": clip}, dp_epsilon_per_round=eps0,
                   **({} if noise else {"dp_noise_free": True})) for s in _seeds(profile, n_seeds)]
        for clip in FORMULA_CLIPS for noise in (True, False)}


def formula_sweep_table(runs: Runs, no_dp: np.ndarray) -> pd.DataFrame:
    """One row per clip of :func:`formula_sweep` in ``runs``: final accuracy with the noise and without,
    and the points each costs against no DP (``no_dp``: its accuracies, seed by seed), the clip's share
    of the formula's whole cost."""
    rows = []
    for clip in FORMULA_CLIPS:
        on, off = ("formula C", clip, True), ("formula C", clip, False)
        if on not in runs.results or off not in runs.results:
            continue
        a_on, a_off = np.array(runs.by_seed(on)), np.array(runs.by_seed(off))
        whole, clip_cost = float(np.mean(no_dp - a_on)), float(np.mean(no_dp - a_off))
        rows.append({"clip C": clip, "with noise (%)": a_on.mean(), "without noise (%)": a_off.mean(),
                     "cost with noise (pts)": whole, "cost of the clip alone (pts)": clip_cost,
                     "the noise adds (pts)": whole - clip_cost, "seeds": len(a_on)})
    return pd.DataFrame(rows)


def tuned_dp(lr: float, clip: float) -> dict:
    """Record-level DP-SGD (ghost clipping: the same clipped sums, cheaper) at learning rate ``lr``
    (eta_min of eq. 1 one tenth of it) and clip ``clip``, spending the grid's epsilon."""
    return {**RECORD_DP, "dp_grad": "ghost", "dp_clip": clip, "dp_epsilon_total": RECORD_GRID_EPSILON,
            "lr": lr, "lr_min": lr / 10}


def record_setting(profile: str) -> dict:
    """The (lr, C) record-level DP-SGD trains at ``profile``: at ``paper`` the paper grid's choice
    (:data:`~studies.moon_dpap.settings.RECORD_TUNED_PAPER`, tuned at the horizon it runs, issue 74),
    elsewhere the quick grid's (:data:`~studies.moon_dpap.settings.RECORD_TUNED`)."""
    return RECORD_TUNED_PAPER if profile == "paper" else RECORD_TUNED


def record_tuned(profile: str, seed: int) -> Config:
    """Record-level DP-SGD at ``profile``'s tuned setting (:func:`record_setting`), spending the grid's
    epsilon."""
    s = record_setting(profile)
    return config_for("moon_dpap", profile, seed, **tuned_dp(s["lr"], s["dp_clip"]))


def per_client_sigma(profile: str) -> ConfigSet:
    """Record-level DP-SGD with one sigma for every client (:data:`RECORD_TUNED_LABEL`) and with each
    client's own (:data:`RECORD_PER_CLIENT_LABEL`), at the same tuned setting, budget and seeds, at
    :func:`grid_profile` (quick; smoke in the tests): the quick page trains them, the paper page reads
    them. The variant is not trained at ``paper`` (its record-level seeds there take many hours of this CPU
    each batch, spent first on the runs that decide verdicts)."""
    at = grid_profile(profile)
    seeds = _seeds(at, None)
    return {RECORD_TUNED_LABEL: [record_tuned(at, s) for s in seeds],
            RECORD_PER_CLIENT_LABEL: [record_tuned(at, s).replace(dp_sigma="per_client") for s in seeds]}


def _span(values: list[float]) -> str:
    """``low-high`` of ``values`` at 3 significant digits, one number where they print alike."""
    lo, hi = f"{min(values):.3g}", f"{max(values):.3g}"
    return lo if lo == hi else f"{lo}-{hi}"


def per_client_sigma_table(runs: Runs) -> pd.DataFrame:
    """One row per sigma choice of :func:`per_client_sigma` in ``runs``: the noise multipliers its clients
    ran at and the epsilon each client's records spend (ranges over the clients of every seed's
    partition), its final accuracy over seeds and the seeds that collapsed to one class; the per-client
    row also its difference to one sigma paired by seed, with its 95 % interval."""
    from studies.claims import interval, paired_ci

    rows = []
    one = np.array(runs.by_seed(RECORD_TUNED_LABEL)) if RECORD_TUNED_LABEL in runs.results else None
    for label, name in ((RECORD_TUNED_LABEL, "one sigma (the least protected client's)"),
                        (RECORD_PER_CLIENT_LABEL, "a sigma per client")):
        if label not in runs.results:
            continue
        rs = runs.results[label]
        privacy = [r.meta["privacy"] for r in rs]
        sigmas = [z for p in privacy for z in p.get("per_client_noise_multiplier", [p["noise_multiplier"]])]
        eps = [e for p in privacy for e in p["per_client_epsilon"]]
        acc = np.array(runs.by_seed(label))
        row = {"sigma": name, "noise multiplier (clients)": _span(sigmas), "epsilon per client": _span(eps),
               "final accuracy (%)": acc.mean(), "seeds": len(acc),
               "seeds at chance": sum(1 for r in rs if collapse_of(r)["rounds"])}
        if label == RECORD_PER_CLIENT_LABEL and one is not None and len(one) == len(acc):
            row["minus one sigma (pts)"] = interval(*paired_ci(acc, one))
        rows.append(row)
    return pd.DataFrame(rows)


def fig2(profile: str, n_seeds: int | None = None, eps0: float = 1.0, clip: float = 0.5) -> ConfigSet:
    """Without DP; with the eq. 5 schedule at ``eps0``; with constant noise spending the same
    total; the formula in circulation; record-level DP-SGD at the tuned (lr, C), with its tuning grid;
    and the two readings' frontiers (:func:`readings`)."""
    seeds = _seeds(profile, n_seeds)
    dp = {**FIG2_DP, "dp_clip": clip}
    _, _, eps_total = fig2_schedule(profile, eps0, clip)
    return {
        FORMULA: [config_for("moon_dpap", profile, s, **FORMULA_DP, dp_epsilon_per_round=eps0)
                  for s in seeds],
        FORMULA_NOISE_OFF: [config_for("moon_dpap", profile, s, **FORMULA_DP, dp_epsilon_per_round=eps0,
                                       dp_noise_free=True) for s in seeds],
        RECORD_TUNED_LABEL: [record_tuned(profile, s) for s in seeds],
        # at paper, the quick grid's choice beside it: the runs that collapsed (issue 74)
        **({RECORD_QUICK_CHOICE_LABEL: [
            config_for("moon_dpap", profile, s, **tuned_dp(RECORD_TUNED["lr"], RECORD_TUNED["dp_clip"]))
            for s in seeds]} if profile == "paper" else {}),
        # the quick tuning grid runs at a reduced scale: the quick page trains it, the paper page reads it;
        # the paper grid runs at the paper's horizon (its first rounds): the paper page trains it
        **(record_grid(profile) if profile != "paper" else {}),
        **(paper_grid(profile) if profile in ("paper", "smoke") else {}),
        # the formula's clip swept with noise on and off (at quick; the paper page reads it)
        **(formula_sweep(profile, n_seeds, eps0) if profile != "paper" else {}),
        # record-level DP-SGD with a sigma per client, a labelled variant (at quick; the paper page reads it)
        **({RECORD_PER_CLIENT_LABEL: per_client_sigma(profile)[RECORD_PER_CLIENT_LABEL]}
           if profile != "paper" else {}),
        "moon_dpap": [config_for("moon_dpap", profile, s) for s in seeds],
        "moon_dpap (DP, eq. 5 schedule)": [
            config_for("moon_dpap", profile, s, **dp, dp_epsilon_per_round=eps0) for s in seeds
        ],
        "moon_dpap (DP, constant noise)": [
            config_for(
                "moon_dpap", profile, s, **{**dp, "dp_schedule": "constant"}, dp_epsilon_total=eps_total
            )
            for s in seeds
        ],
        **readings(profile, n_seeds),
    }


def table1(profile: str, n_seeds: int | None = None) -> ConfigSet:
    return {
        f"{m}|{n}": [config_for(m, profile, s, clients=n) for s in _seeds(profile, n_seeds)]
        for m in TABLE1_METHODS
        for n in (10, 20)
    }


#: Table 2's page also reads FedAvg's runs (Fig. 1's, the same configurations: nothing is trained twice):
#: the variant without the cosine learning rate trains at FedAvg's constant one, the matched-learning-rate
#: comparison of Fig. 1's "4.7 points above FedAvg" (issue 74).
MATCHED_LR = ("no_dynamic_lr", "fedavg")


def table2(profile: str, n_seeds: int | None = None) -> ConfigSet:
    seeds = _seeds(profile, n_seeds)
    return {
        **{k: [config_for("moon_dpap", profile, s, **v) for s in seeds] for k, v in ABLATIONS.items()},
        "fedavg": [config_for("fedavg", profile, s) for s in seeds],
    }


#: Total epsilons of the two frontiers (delta 1e-5). The client-level grid reaches further: it
#: needs epsilon in the hundreds before accuracy returns.
FRONTIER_EPSILONS = (1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)
RECORD_EPSILONS = (1.0, 3.0, 10.0, 30.0, 100.0)
FRONTIER_CLIPS = (0.1, 0.5, 2.0)
#: The two readings of "noise in the gradient update process" (our choices of C: the paper gives
#: none). Client-level: each client's update clipped to 0.5, noise at the server, replace one
#: client. Record-level: DP-SGD in each client, per-sample gradients clipped to 1.0 (the usual
#: DP-SGD default, e.g. Opacus' examples), add/remove one record.
CLIENT_DP = dict(dp="central", dp_delta=1e-5, dp_schedule="constant", dp_clip=0.5)
RECORD_DP = dict(dp="record", dp_delta=1e-5, dp_schedule="constant", dp_clip=1.0)


def record_dp(profile: str) -> dict:
    """Record-level DP-SGD of the frontiers at ``profile`` (issue 79): the tuned learning rate and clip
    (:func:`record_setting`, :func:`tuned_dp`; at the paper's lr 0.005 with
    C = 1 the record-level runs barely train, so a frontier of them measures the learning rate, not the
    noise), ghost clipping, each point's total epsilon set by the frontier."""
    s = record_setting(profile)
    dp = tuned_dp(s["lr"], s["dp_clip"])
    return {k: v for k, v in dp.items() if k != "dp_epsilon_total"}


READINGS = {
    "client": "client-level: a client's whole data (replace one client), noise at the server",
    "record": "record-level: one training example (add/remove), DP-SGD in each client",
}


def readings(profile: str, n_seeds: int | None = None, epsilons=FRONTIER_EPSILONS,
             record_epsilons=RECORD_EPSILONS) -> ConfigSet:
    """The accuracy-epsilon frontier of each reading: constant noise calibrated to each total
    epsilon (record-level at its tuned learning rate and clip, :func:`record_dp`). Labels: ``"no DP"``,
    ``("client", eps)``, ``("record", eps)``."""
    seeds = _seeds(profile, n_seeds)
    out: ConfigSet = {"no DP": [config_for("moon_dpap", profile, s) for s in seeds]}
    for reading, dp, grid in (("client", CLIENT_DP, epsilons),
                              ("record", record_dp(profile), record_epsilons)):
        for e in grid:
            out[(reading, e)] = [config_for("moon_dpap", profile, s, **dp, dp_epsilon_total=e) for s in seeds]
    return out


def frontier(
    profile: str,
    n_seeds: int | None = None,
    epsilons=FRONTIER_EPSILONS,
    record_epsilons=RECORD_EPSILONS,
    clips=FRONTIER_CLIPS,
    clip_epsilon: float = 100.0,
) -> ConfigSet:
    """Both readings' frontiers, and client-level DP's clip norm at one epsilon (labels
    ``("client", eps, C)``)."""
    seeds = _seeds(profile, n_seeds)
    out = readings(profile, n_seeds, epsilons, record_epsilons)
    for c in clips:
        dp = {**CLIENT_DP, "dp_clip": c}
        out[("client", clip_epsilon, c)] = [
            config_for("moon_dpap", profile, s, **dp, dp_epsilon_total=clip_epsilon) for s in seeds
        ]
    return out


def frontier_table(runs: Runs) -> pd.DataFrame:
    """One row per (reading, epsilon) of the frontiers in ``runs``: accuracy over seeds and the
    accounting each result recorded (the noise multiplier, the sampling rate and the number of
    noisy releases a protected unit takes part in over the run, the epsilon spent)."""
    rows = []
    for label, rs in runs.results.items():
        if not (isinstance(label, tuple) and len(label) == 2):
            continue
        reading, eps = label
        acc = [100 * r.final["test_acc"] for r in rs]
        first = rs[0]
        privacy = first.meta.get("privacy", {})
        if reading == "record":
            q, releases = privacy.get("sampling_rate", float("nan")), first.config.rounds * privacy.get(
                "steps_per_round", 0)
        else:
            q, releases = 1.0, first.config.rounds
        rows.append({
            "reading": reading,
            "epsilon": eps,
            "epsilon spent": first.history[-1].get("epsilon_spent", float("nan")),
            "noise multiplier": first.history[0].get("noise_multiplier", float("nan")),
            "sampling rate": q,
            "noisy releases": releases,
            "clip C": first.config.dp_clip,
            "acc_mean": float(np.mean(acc)),
            "acc_std": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
            "seeds": len(acc),
        })
    return pd.DataFrame(rows).sort_values(["reading", "epsilon"]).reset_index(drop=True)


def epsilon_at(table: pd.DataFrame, reading: str, accuracy_pct: float) -> float | None:
    """The total epsilon at which ``reading``'s mean accuracy first reaches ``accuracy_pct``,
    interpolated linearly in log epsilon between the grid points around the crossing; None when
    the grid never reaches it (reached at the first point: that point's epsilon)."""
    t = table[table["reading"] == reading].sort_values("epsilon")
    eps, acc = t["epsilon"].to_numpy(float), t["acc_mean"].to_numpy(float)
    for i in range(len(eps)):
        if acc[i] >= accuracy_pct:
            if i == 0:
                return float(eps[0])
            f = (accuracy_pct - acc[i - 1]) / (acc[i] - acc[i - 1])
            return float(np.exp(np.log(eps[i - 1]) + f * (np.log(eps[i]) - np.log(eps[i - 1]))))
    return None


ALPHAS = (0.1, 0.5, 5.0)


def alpha_paper_runs(alphas=ALPHAS) -> Runs:
    """The alpha page's runs committed at ``paper`` (every seed of a label, or the label is left out),
    loaded, never trained: the page's answer at the papers' scale (alpha = 0.5 is Fig. 1's pair)."""
    return committed_runs(alpha("paper", None, alphas))


def alpha(profile: str, n_seeds: int | None = None, alphas=ALPHAS) -> ConfigSet:
    return {
        f"{m}|{a:g}": [config_for(m, profile, s, alpha=a) for s in _seeds(profile, n_seeds)]
        for m in ("fedavg", "moon_dpap")
        for a in alphas
    }


#: page (notebook stem) -> the configurations it runs, with the page's default parameters.
PAGES = {
    "moon_dpap_fig1": fig1,
    "moon_dpap_fig2": fig2,
    "moon_dpap_table1": table1,
    "moon_dpap_table2": table2,
    "moon_dpap_frontier": frontier,
    "moon_dpap_alpha": alpha,
}


# ---- which runs decide which claim (studies.moon_dpap.claims records them) ----------------------------
def _fig1_needs(cs: ConfigSet) -> list[Needs]:
    every = tuple(cs)
    return [
        Needs("MOON-DPAP reaches 83.6 % accuracy (loss 0.44)", ("moon_dpap",)),
        # MOON-DPAP first: the runs at paper refute it once one method is ahead of it (issue 74)
        Needs("MOON-DPAP is the best of the six methods",
              ("moon_dpap", *(m for m in every if m != "moon_dpap")), refutable=True),
        Needs("MOON-DPAP is 4.7 points above FedAvg (Dirichlet alpha = 0.5, our federation)",
              ("moon_dpap", "fedavg")),
        Needs("MOON-DPAP is 4.7 points above FedAvg: FedAvg's level it implies (83.6 - 4.7 = 78.9 %) "
              "(Dirichlet alpha = 0.5, our federation)", ("fedavg",)),
        Needs("MOON is close to FedAvg", ("moon", "fedavg")),
        Needs("SCAFFOLD is much lower than the others (5+ points below their mean)", every),
    ]


def _fig2_needs(cs: ConfigSet) -> list[Needs]:
    """"with DP ... 77 %" and the cost of DP are graded under every reading (issue 63): the client-level
    run, the formula in circulation and the tuned record-level run decide them, before anything else.
    The record-level runs are optional to the two claims over all readings (issue 74): retuned at the
    horizon it runs, the reading trains after the others exist at ``paper``, and the claims stay graded
    there meanwhile, the reading named as still open (its own row waits for its runs)."""
    readings_ = (CENTRAL, FORMULA)
    grid = {r: tuple(k for k in cs if isinstance(k, tuple) and len(k) == 2 and k[0] == r)
            for r in ("client", "record")}
    tuning = tuple(k for k in cs if isinstance(k, tuple) and k and k[0] == "paper grid")
    with_dp = "with DP MOON-DPAP ends at 77 % accuracy (loss 0.71)"
    return [
        Needs(with_dp, readings_, deciding=True, optional=(RECORD_TUNED_LABEL,)),
        Needs(f"{with_dp} [reading: client-level central]", (CENTRAL,)),
        # graded from the settings and the central runs (its noise is sqrt(m) times theirs)
        Needs(f"{with_dp} [reading: client-level local]", (CENTRAL,)),
        # issue 74: tuned at the horizon it runs: the paper grid decides the setting its seeds train at
        # (trained first with the reading; the reading is graded on its seeds, the grid shown beside)
        Needs(f"{with_dp} [reading: record-level DP-SGD]", (RECORD_TUNED_LABEL,), deciding=True,
              optional=tuning),
        Needs(f"{with_dp} [reading: the formula in circulation]", (FORMULA,)),
        Needs("77 % under DP at a meaningful epsilon (<= 10), if the DP is client-level", grid["client"]),
        Needs("77 % under DP at a meaningful epsilon (<= 10), if the DP is record-level", grid["record"]),
        # the formula's noise-off control splits its cost into clip and noise (issue 74) where it is in
        Needs("DP costs about 6.6 points (83.6 → 77 %)", ("moon_dpap", *readings_), deciding=True,
              optional=(RECORD_TUNED_LABEL, FORMULA_NOISE_OFF)),
    ]


def _table1_needs(cs: ConfigSet) -> list[Needs]:
    return [
        Needs("every method is more accurate with 10 clients than with 20", tuple(cs)),
        Needs("MOON-DPAP is the best method with 10 clients (with 20: Fig. 1's claim, the same runs)",
              tuple(k for k in cs if k.endswith("|10"))),
        Needs("Table 1's accuracies at 20 clients (40-59 %)", tuple(k for k in cs if k.endswith("|20"))),
    ]


def _table2_needs(cs: ConfigSet) -> list[Needs]:
    variants = tuple(k for k in cs if k in ABLATIONS)
    return [
        *(Needs(text, variants) for text in (
            "the full method is the most accurate variant", "removing any one component lowers accuracy",
            "removing all three is the worst variant", "Table 2's accuracies (78.8-83.7 %)")),
        Needs("MOON-DPAP is 4.7 points above FedAvg: with the learning rate matched (MOON-DPAP without "
              "its cosine learning rate) (Dirichlet alpha = 0.5, our federation)", MATCHED_LR),
    ]


def _alpha_needs(cs: ConfigSet) -> list[Needs]:
    """Fig. 1's gap in the harder federation (alpha = 0.1), before anything else (issue 63)."""
    if "moon_dpap|0.1" not in cs:
        return []
    return [Needs("MOON-DPAP is 4.7 points above FedAvg (Dirichlet alpha = 0.1)",
                  ("moon_dpap|0.1", "fedavg|0.1"), deciding=True),
            Needs("MOON-DPAP is 4.7 points above FedAvg: FedAvg's level it implies (83.6 - 4.7 = 78.9 %) "
                  "(Dirichlet alpha = 0.1)", ("fedavg|0.1",))]


#: page -> the claims its runs decide (the frontier page only shows).
CLAIMS = {
    "moon_dpap_alpha": _alpha_needs,
    "moon_dpap_fig1": _fig1_needs,
    "moon_dpap_fig2": _fig2_needs,
    "moon_dpap_table1": _table1_needs,
    "moon_dpap_table2": _table2_needs,
}


# ---- evidence the pages show ------------------------------------------------------------------------
def noise_vs_signal(config: Config, zs: list[float], dims: int) -> pd.DataFrame:
    """Per round: the norm of the noise added to the sum of clipped updates (central mode,
    replace one client: std ``2 z_t C`` per coordinate, norm about ``2 z_t C sqrt(d)``) against
    the largest possible norm of that sum, ``m C`` (every client's update at the clip norm)."""
    c, m = config.dp_clip, config.clients
    noise = [2 * z * c * math.sqrt(dims) for z in zs]
    return pd.DataFrame(
        {
            "round": np.arange(1, len(zs) + 1),
            "noise norm": noise,
            "largest signal norm (m C)": m * c,
            "noise / signal": [n / (m * c) for n in noise],
        }
    )


def fig2_context(profile: str, eps0: float = 1.0, clip: float = 0.5) -> tuple[float, float, float, int]:
    """What Fig. 2's DP claims are graded with at ``profile``: the total epsilon of the eq. 5 schedule,
    the untrained model's accuracy (%), the first round's noise-to-signal ratio
    (:func:`noise_vs_signal`) and the number of clients."""
    from fedlib.models import build_model, count_parameters
    from studies.common import untrained_accuracy

    cfg, zs, eps_total = fig2_schedule(profile, eps0, clip)
    dims = count_parameters(build_model(cfg.model, proj_dim=cfg.projection_dim))
    ratio = float(noise_vs_signal(cfg, zs, dims)["noise / signal"].iloc[0])
    return eps_total, untrained_accuracy(cfg), ratio, cfg.clients


READING_NAMES = {"client": "client-level", "record": "record-level"}


def run_label(label) -> str:
    """A run's label as a reader reads it: ``("client", 3.0)`` -> "client-level, epsilon 3",
    ``("client", 100.0, 0.5)`` -> "client-level, epsilon 100, C 0.5"; other labels as they are."""
    if isinstance(label, tuple) and label and label[0] in READING_NAMES:
        parts = [READING_NAMES[label[0]], f"epsilon {label[1]:g}"]
        if len(label) > 2:
            parts.append(f"C {label[2]:g}")
        return ", ".join(parts)
    return str(label)


def readings_compared(table: pd.DataFrame) -> str:
    """Which reading ends more accurate at each budget both were run at (from
    :func:`frontier_table`), in words: the frontier page's comparison is generated, not asserted."""
    acc = table.pivot_table(index="epsilon", columns="reading", values="acc_mean")
    both = acc.dropna(subset=[c for c in ("client", "record") if c in acc.columns])
    if not {"client", "record"} <= set(acc.columns) or both.empty:
        return ""
    ahead = [f"{e:g}" for e, row in both.iterrows() if row["record"] > row["client"]]
    behind = [f"{e:g}" for e, row in both.iterrows() if row["record"] <= row["client"]]
    rec = both["record"]
    text = (f"In these runs record-level DP-SGD ends at {rec.min():.1f} to {rec.max():.1f} % across its "
            f"budgets, client-level at {both['client'].min():.1f} to {both['client'].max():.1f} %")
    if ahead and behind:
        return text + (f": record-level is ahead at epsilon = {', '.join(ahead)} and behind at epsilon = "
                       f"{', '.join(behind)} (means over seeds).")
    return text + (": record-level is ahead at every budget both were run at (means over seeds)." if ahead
                   else ": record-level is not ahead at any budget both were run at (means over seeds).")


def failed_runs(runs: Runs, chance_pct: float = 10.0, margin: float = 3.0) -> pd.DataFrame:
    """Runs that diverged (a NaN or infinite loss) or ended within ``margin`` points of chance."""
    rows = []
    for label, rs in runs.results.items():
        for r in rs:
            losses = [h["test_loss"] for h in r.history if h.get("test_loss") is not None]
            acc = 100 * r.final["test_acc"]
            bad_loss = [v for v in losses if not math.isfinite(v)]
            if bad_loss or abs(acc - chance_pct) <= margin:
                rows.append(
                    {
                        "run": run_label(label),
                        "seed": r.config.seed,
                        "final accuracy (%)": round(acc, 2),
                        "final loss": r.final["test_loss"],
                        "what": "loss NaN/inf" if bad_loss else "accuracy at chance",
                    }
                )
    return pd.DataFrame(rows, columns=["run", "seed", "final accuracy (%)", "final loss", "what"])


def plot_readings(ax, table: pd.DataFrame, no_dp_pct: float, level_pct: float, chance_pct: float = 10.0):
    """The two frontiers (mean ± one std over seeds) on a log-epsilon axis, with the non-private
    accuracy, the paper's level under DP and chance as horizontal lines."""
    styles = {"client": dict(color="C3", marker="o", label="client-level (replace one client)"),
              "record": dict(color="C0", marker="s", label="record-level DP-SGD (add/remove one record)")}
    for reading, style in styles.items():
        t = table[table["reading"] == reading]
        if len(t):
            ax.errorbar(t["epsilon"], t["acc_mean"], yerr=t["acc_std"], capsize=3, **style)
    ax.axhline(no_dp_pct, color="k", ls="--", label="no DP")
    ax.axhline(level_pct, color="0.4", ls=(0, (6, 2)), label=f"paper's Fig. 2 with DP: {level_pct:g} %")
    ax.axhline(chance_pct, color="0.6", ls=":", label="chance")
    ax.set(xscale="log", xlabel="total $\\epsilon$ of the run ($\\delta = 10^{-5}$)",
           ylabel="test accuracy (%)", ylim=(0, 100))
    ax.grid(alpha=0.3)
    return ax


# ---- Fig. 2's readings (issue 63) ----------------------------------------------------------------------
def grid_table(runs: Runs) -> pd.DataFrame:
    """The record-level tuning grid in ``runs``: one row per (lr, C) with its validation accuracy and
    epsilon, the chosen setting marked."""
    rows = []
    for label, rs in runs.results.items():
        if isinstance(label, tuple) and label and label[0] == "grid":
            r = rs[0]
            rows.append({"learning rate": label[1], "clip C": label[2],
                         "validation accuracy (%)": 100 * r.final["test_acc"],
                         "epsilon": r.history[-1].get("epsilon_spent", float("nan")),
                         "chosen": (label[1], label[2]) == (RECORD_TUNED["lr"], RECORD_TUNED["dp_clip"])})
    return pd.DataFrame(rows).sort_values(["learning rate", "clip C"]).reset_index(drop=True)


def grid_choice(table: pd.DataFrame) -> tuple[float, float]:
    """The (lr, C) of the grid's highest validation accuracy (the first of a tie, in grid order)."""
    best = table.loc[table["validation accuracy (%)"].idxmax()]
    return float(best["learning rate"]), float(best["clip C"])


#: The column of :func:`readings_of_fig2` that gives where a reading's runs end at the papers' scale.
AT_PAPER_COLUMN = "at the papers' scale: final accuracy (%), epsilon"


def readings_of_fig2(runs: Runs, cfg: Config, chance_pct: float = 10.0,
                     paper: Runs | None = None) -> pd.DataFrame:
    """One row per reading of Fig. 2's DP: relation, guarantee, and the final accuracy (mean ± std over
    seeds, and the seeds themselves when some end at chance and some do not) and epsilon of its runs in
    ``runs`` (the local reading is analytic: no runs). ``paper``: the readings' runs complete at the
    papers' scale while the page renders below it (:func:`studies.settled.show_paper_first`), in one
    more column (:data:`AT_PAPER_COLUMN`) when any reading has them."""
    from studies.moon_dpap.settings import READINGS

    runs_of = {READINGS["central"].name: CENTRAL, READINGS["record"].name: RECORD_TUNED_LABEL,
               READINGS["formula"].name: FORMULA}

    def ended(label, of: Runs = runs) -> tuple[str, float | None]:
        """The final accuracy of ``label``'s seeds in words, and the epsilon it spent (None: no valid
        guarantee)."""
        a = np.array(of.by_seed(label))
        split = seeds_at_chance(a, chance_pct)
        acc = (f"{a.mean():.1f} ± {a.std(ddof=1) if len(a) > 1 else 0.0:.1f} ({len(a)} seeds)"
               + (f" — {split}" if split else ""))
        return acc, of.results[label][0].history[-1].get("epsilon_spent")

    def eps_words(e: float | None) -> str:
        return f"{e:.2f}" if e is not None else "none (no valid guarantee)"

    at_paper = {}
    if paper is not None:
        for name, label in runs_of.items():
            if label in paper.results:
                acc, e = ended(label, paper)
                at_paper[name] = f"{acc}, " + ("no epsilon (no valid guarantee)" if e is None
                                               else f"epsilon {eps_words(e)}")

    rows = []
    for reading in READINGS.values():
        label = runs_of.get(reading.name)
        acc, eps = "no runs (analytic: the central reading's noise times sqrt(m))", ""
        if label in runs.results:
            acc, e = ended(label)
            eps = eps_words(e)
        elif label == RECORD_TUNED_LABEL:
            acc = "not trained yet at this profile"
        rows.append({"reading": reading.name, "protects (relation)": reading.relation,
                     "guarantee": reading.guarantee, "final accuracy (%)": acc, "epsilon (delta 1e-5)": eps,
                     **({AT_PAPER_COLUMN: at_paper.get(reading.name, "not complete yet" if label else "")}
                        if at_paper else {})})
        if label == RECORD_TUNED_LABEL and RECORD_QUICK_CHOICE_LABEL in runs.results:
            c = runs.results[RECORD_QUICK_CHOICE_LABEL][0].config
            acc, e = ended(RECORD_QUICK_CHOICE_LABEL)
            eps = eps_words(e)
            name = f"{reading.name} at the quick grid's choice (lr {c.lr:g}, C = {c.dp_clip:g})"
            rows.append({"reading": name,
                         "protects (relation)": reading.relation, "guarantee": reading.guarantee,
                         "final accuracy (%)": acc, "epsilon (delta 1e-5)": eps,
                         **({AT_PAPER_COLUMN: ""} if at_paper else {})})
    return pd.DataFrame(rows)


def learning_rates_note(runs: Runs, names: dict) -> str:
    """Which of Fig. 2's curves (``names``: label -> name) train at which learning rate, when they
    differ, and what that means for a DP curve that ends above the curve without DP (issue 79: a tuned
    record-level run at lr 0.2 beside no DP at 0.005 is not DP helping); empty when all share one."""
    lrs = {label: runs.results[label][0].config.lr for label in names if label in runs.results}
    if len(set(lrs.values())) < 2:
        return ""
    groups: dict[float, list[str]] = {}
    for label, lr in lrs.items():
        groups.setdefault(lr, []).append(names[label])
    said = "; ".join(f"{', '.join(ns)} at {lr:g}" for lr, ns in sorted(groups.items()))
    no_dp = runs.summary().loc["moon_dpap", "acc_mean"] if "moon_dpap" in runs.results else None
    ahead = [k for k in lrs if k != "moon_dpap" and no_dp is not None
             and lrs[k] != lrs.get("moon_dpap") and runs.summary().loc[k, "acc_mean"] > no_dp]
    rounds = runs.results[next(iter(lrs))][0].config.rounds
    why = "".join(f" The {names[k]} run ends above the run without DP: it trains with a "
                  f"{lrs[k] / lrs['moon_dpap']:g} times larger learning rate over these {rounds} rounds, so "
                  "the two do not compare at one learning rate (DP does not help)." for k in ahead)
    return f"**Learning rates.** The curves train at different learning rates: {said}.{why}"


def curve_words(table: pd.DataFrame, no_dp_pct: float) -> list[str]:
    """What each reading's frontier does, in words read off ``table`` (:func:`frontier_table`): its
    range over its budgets, where it is highest, and its distance to no DP there."""
    parts = []
    for reading, name in (("record", "record-level"), ("client", "client-level")):
        t = table[table["reading"] == reading].sort_values("epsilon")
        if len(t):
            lo, hi = t["acc_mean"].min(), t["acc_mean"].max()
            at = t.loc[t["acc_mean"].idxmax(), "epsilon"]
            first, last = t["acc_mean"].iloc[0], t["acc_mean"].iloc[-1]
            parts.append(f"the {name} curve runs from {first:.0f} % at epsilon {t['epsilon'].min():g} "
                         f"to {last:.0f} % at {t['epsilon'].max():g} (between {lo:.0f} and {hi:.0f} %, "
                         f"highest at epsilon {at:g}, {no_dp_pct - hi:.0f} points below no DP there)")
    return parts


def frontier_figure_markdown(table: pd.DataFrame, no_dp_pct: float, clip_acc: dict, clip_epsilon: float,
                             glued: str, profile: str = "quick") -> str:
    """The MyST of the frontier page's figure, its alt text and caption written from the data
    (:func:`curve_words`; ``clip_acc``: clip norm -> mean accuracy at ``clip_epsilon``; ``profile``: the
    page's, whose tuned record-level setting the caption names), issue 79."""
    words = "; ".join(curve_words(table, no_dp_pct))
    clips = ", ".join(f"{a:.0f} % at C = {c:g}" for c, a in clip_acc.items())
    s = record_setting(profile)
    tuned = f"learning rate {s['lr']:g} and clip $C$ = {s['dp_clip']:g}"
    alt = (f"Left: final accuracy against the total epsilon on a log axis for client-level and record-level "
           f"DP: {words}; horizontal lines mark no DP, the paper's 77 % and chance. Right: client-level "
           f"accuracy against the clip norm at epsilon {clip_epsilon:g}: {clips}.")
    caption = (f"The frontiers (left): final accuracy of MOON-DPAP against the run's total $\\epsilon$, "
               f"mean ± one standard deviation over seeds, for each reading of the paper's DP ({words}; "
               f"record-level DP-SGD at its tuned {tuned}). Right: the client-level clip norm at one "
               f"$\\epsilon$ ({clips}).")
    return f"```{{glue:figure}} {glued}\n:name: fig-moon-dpap-frontier-fig\n:alt: {alt}\n\n{caption}\n```"


def readings_figure_markdown(table: pd.DataFrame, no_dp_pct: float, level_pct: float, glued: str) -> str:
    """The MyST of Fig. 2's frontier figure with its alt text and caption written from ``table``
    (:func:`frontier_table`): what each reading's curve does is read off the data, not asserted."""
    parts = curve_words(table, no_dp_pct)
    alt = ("Final accuracy against total epsilon on a log axis for the two readings: " + "; ".join(parts) +
           f"; dashed lines mark no DP ({no_dp_pct:.0f} %) and the paper's {level_pct:g} %, a dotted line "
           "chance.")
    caption = ("The two frontiers of Fig. 2's DP: final accuracy against the run's total $\\epsilon$ "
               "($\\delta = 10^{-5}$), mean ± one standard deviation over seeds; " + "; ".join(parts) + ". "
               "{glue:text}`eps77_sentence`")
    return (f"```{{glue:figure}} {glued}\n:name: fig-moon-dpap-fig2-readings\n:alt: {alt}\n\n{caption}\n```")
