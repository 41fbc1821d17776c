"""The configurations each FDL page runs, and the tables its evidence is read from. The notebooks
run them; the campaign collects them through :data:`PAGES`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedlib.models import build_model, count_parameters
from fedlib.privacy.local import fdl_published_epsilon, ldp_fl_epsilon
from studies.common import ConfigSet, Needs, Runs, fmt, seeds_for
from studies.fdl.settings import EPSILONS, PAPER, R_VALUES, REPAIR_CONTROLS, SCALES, config_for

PRIVATE = ("ldp_fl", "signds_fl", "fdl", "fdl_corrected")


def _seeds(profile: str, n_seeds: int | None) -> list[int]:
    return seeds_for(SCALES, profile, n_seeds)


def sweep(
    profile: str, n_seeds: int | None = None, epsilons=EPSILONS, partitions=("iid", "noniid"),
    controls: bool = True,
) -> ConfigSet:
    """Every method at every nominal epsilon and partition, keyed ``(method, partition, epsilon)``
    (NoLDP-FL once per partition, under ``epsilon = inf``), and with ``controls`` the controls of our
    repair (:data:`~studies.fdl.settings.REPAIR_CONTROLS`, IID, at the largest budget; those without
    noise under ``epsilon = inf``)."""
    seeds = _seeds(profile, n_seeds)
    out: ConfigSet = {}
    for part in partitions:
        out[("noldp", part, math.inf)] = [config_for("noldp", profile, s, part) for s in seeds]
        for method in PRIVATE:
            for eps in epsilons:
                out[(method, part, eps)] = [config_for(method, profile, s, part, eps) for s in seeds]
    if controls and "iid" in partitions:
        top = max(epsilons)
        for method in REPAIR_CONTROLS:
            eps = math.inf if "noise_free" in method else top
            out[(method, "iid", eps)] = [config_for(method, profile, s, "iid", top) for s in seeds]
    return out


def repair_labels(top: float) -> dict[str, tuple]:
    """The labels of our repair's runs at budget ``top`` and of its controls and references (IID)."""
    return {"repair": ("fdl_corrected", "iid", top), "as published": ("fdl", "iid", top),
            "no LDP": ("noldp", "iid", math.inf),
            **{m: (m, "iid", math.inf if "noise_free" in m else top) for m in REPAIR_CONTROLS}}


def fig4(profile: str, n_seeds: int | None = None, epsilon: float = 0.5) -> ConfigSet:
    return sweep(profile, n_seeds, epsilons=(epsilon,), controls=False)


def table1(profile: str, n_seeds: int | None = None) -> ConfigSet:
    return {
        r: [config_for("fdl", profile, s, "iid", 0.5, fdl_r=r) for s in _seeds(profile, n_seeds)]
        for r in R_VALUES
    }


#: page (notebook stem) -> the configurations it runs, with the page's default parameters.
PAGES = {"fdl_table1": table1, "fdl_fig3": sweep, "fdl_fig4": fig4}


# ---- which runs decide which claim (studies.fdl.claims records them) --------------------------------
def _table1_needs(cs: ConfigSet) -> list[Needs]:
    return [
        Needs(r"accuracy peaks at $r$ = 0.010", tuple(cs)),
        *[Needs(accuracy_claim(r), (r,)) for r in cs],
        Needs(SENSITIVITY_CLAIM, (0.010, 0.015)),
        *[Needs(kept_claim(r), (r,)) for r in cs],
        *[Needs(saving_claim(r), (r,)) for r in cs],
    ]


def accuracy_claim(r: float) -> str:
    """Table 1's accuracy at one value of r."""
    return f"{PAPER['table1'][r][2]:g} % accuracy at $r$ = {r:.3f}"


def kept_claim(r: float) -> str:
    """Table 1's shares of parameters kept by the filter and sent at one value of r."""
    kept, sent, _ = PAPER["table1"][r]
    return f"$C_r$ = {kept:g} C and $C_s$ = {sent:g} C at $r$ = {r:.3f}"


#: The paper's sensitivity of accuracy to r: 41.6 points between r = 0.010 and r = 0.015.
SENSITIVITY_CLAIM = (r"accuracy falls by {:.1f} points from $r$ = 0.010 to $r$ = 0.015"
                     .format(PAPER["table1"][0.010][2] - PAPER["table1"][0.015][2]))


#: The communication claim: one claim of the paper, graded at every r of Table 1 (each a sub-row, issue 74).
SAVING = "FDL saves at least 60 % of the communication cost"


def saving_claim(r: float) -> str:
    """The communication claim at one value of r (a sub-row of :data:`SAVING`)."""
    return f"{SAVING} ($r$ = {r:.3f})"


def paper_saving(r: float) -> float:
    """The share (%) of parameters the paper's own Table 1 leaves unsent at ``r``: ``1 - C_s / C``."""
    return 100 * (1 - PAPER["table1"][r][1])


def _fig3_needs(cs: ConfigSet) -> list[Needs]:
    """Only the largest and smallest budgets decide the claims; the grid between them draws the curves."""
    eps = sorted({k[2] for k in cs if math.isfinite(k[2])})
    top, low = eps[-1], eps[0]
    out = [
        Needs(f"FDL is the best private method as $\\epsilon$ grows ({part})",
              tuple((m, part, top) for m in ("ldp_fl", "signds_fl", "fdl")) + (("fdl", part, low),))
        for part in ("iid", "noniid")
    ]
    repair = repair_labels(top)
    if all(label in cs for label in repair.values()):
        out.append(Needs(r"our repair of FDL (a valid $\epsilon$-LDP guarantee) keeps FDL's accuracy (IID)",
                         tuple(repair.values()), deciding=True))
    return out


def _fig4_needs(cs: ConfigSet) -> list[Needs]:
    fdl = tuple(k for k in cs if k[0] == "fdl")
    return [
        Needs("IID: FDL converges within 50 rounds (last 5 rounds change less than 1 point)",
              tuple(k for k in fdl if k[1] == "iid")),
        Needs("non-IID is more sensitive to the number of rounds than IID", fdl),
    ]


#: page -> the claims its runs decide.
CLAIMS = {"fdl_table1": _table1_needs, "fdl_fig3": _fig3_needs, "fdl_fig4": _fig4_needs}


# ---- tables -----------------------------------------------------------------------------------------
def frame(runs: Runs) -> pd.DataFrame:
    rows = []
    for (method, part, eps), rs in runs.results.items():
        for r in rs:
            last = r.history[-1]
            rows.append(
                {
                    "method": method,
                    "partition": part,
                    "epsilon": eps,
                    "seed": r.config.seed,
                    "acc": 100 * r.final["test_acc"],
                    "loss": r.final["test_loss"],
                    # a run without local DP has no guarantee: an infinite epsilon, never 0
                    "true_eps_round": last.get("epsilon_round", math.inf),
                    "true_eps_run": last.get("epsilon_spent", math.inf),
                    "sent_frac": last.get("sent_frac", 1.0),
                    "kept_frac": last.get("kept_frac", np.nan),
                    "bytes_up": np.mean([h["bytes_up"] for h in r.history]),
                    "bytes_dense": 4 * count_parameters(build_model(r.config.model)) * r.config.clients,
                }
            )
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame, by=("method", "partition", "epsilon")) -> pd.DataFrame:
    g = df.groupby(list(by), sort=False)
    out = g.agg(
        acc_mean=("acc", "mean"),
        acc_std=("acc", "std"),
        seeds=("seed", "count"),
        true_eps_round=("true_eps_round", "first"),
        true_eps_run=("true_eps_run", "first"),
        sent_frac=("sent_frac", "mean"),
        kept_frac=("kept_frac", "mean"),
        bytes_up=("bytes_up", "mean"),
        bytes_dense=("bytes_dense", "first"),
    )
    out["acc_std"] = out["acc_std"].fillna(0.0)
    return out.sort_index()


# ---- Table 1 -----------------------------------------------------------------------------------------
def table1_frame(results: Runs) -> pd.DataFrame:
    rows = []
    for r, rs in results.results.items():
        kept = np.mean([np.nanmean([h.get("kept_frac", np.nan) for h in x.history]) for x in rs])
        sent = np.mean([np.nanmean([h.get("sent_frac", np.nan) for h in x.history]) for x in rs])
        acc = np.array([100 * x.final["test_acc"] for x in rs])
        p_kept, p_sent, p_acc = PAPER["table1"][r]
        saving = 100 * (
            1
            - np.mean([np.mean([h["bytes_up"] for h in x.history]) for x in rs])
            / (4 * count_parameters(build_model(rs[0].config.model)) * rs[0].config.clients)
        )
        rows.append(
            {
                "r": r,
                "paper C_r/C": p_kept,
                "ours C_r/C": round(float(kept), 3),
                "paper C_s/C": p_sent,
                "ours C_s/C": round(float(sent), 3),
                "paper acc (%)": p_acc,
                "ours acc (%)": fmt(acc.mean(), acc.std(ddof=1) if len(acc) > 1 else 0.0, len(acc)),
                "parameters not sent (%), the paper's count": round(float(100 * (1 - sent)), 1),
                "bytes saved with the indices (%)": round(float(saving), 1),
            }
        )
    return pd.DataFrame(rows)


def published_privacy(dims: int, epsilon: float = 0.5, selected_fraction: float = 0.38) -> pd.DataFrame:
    """What each method's per-client, per-round epsilon is as the papers state it and as it
    actually is, for a model with ``dims`` parameters (FDL: the paper's C_s = 0.38 C at r = 0.01)."""
    th = round(selected_fraction * dims)
    fdl = fdl_published_epsilon(epsilon, th)
    actual = "actual (per client and round)"
    composed = f"{fdl['composed_ignoring_filter']:.3g}"
    return pd.DataFrame(
        [
            {
                "method": "LDP-FL",
                "stated": epsilon,
                actual: ldp_fl_epsilon(epsilon, dims),
                "why": "epsilon per coordinate, d coordinates",
            },
            {
                "method": "SignDS-FL",
                "stated": epsilon,
                actual: epsilon,
                "why": "data-independent choice of nu: holds",
            },
            {
                "method": "FDL as published",
                "stated": epsilon,
                actual: fdl["true"],
                "why": f"data-dependent filter and scale; even without them 2 th eps = {composed}",
            },
            {
                "method": "FDL corrected",
                "stated": epsilon,
                actual: epsilon,
                "why": "public clip and k; k draws at eps_sel / k; Laplace at L1 sensitivity 2k",
            },
        ]
    )


def shares_by_seed(results: Runs, r: float) -> tuple[np.ndarray, np.ndarray]:
    """Per seed at threshold ``r``: the shares of the parameters kept by the filter (``C_r / C``) and
    sent (``C_s / C``), each the mean over rounds."""
    kept = [np.nanmean([h.get("kept_frac", np.nan) for h in x.history]) for x in results.results[r]]
    sent = [np.nanmean([h.get("sent_frac", np.nan) for h in x.history]) for x in results.results[r]]
    return np.array(kept), np.array(sent)


def parameter_saving(results: Runs, r: float) -> np.ndarray:
    """Per seed: the share (%) of the model's parameters a client does not send, ``1 - C_s / C``
    averaged over rounds: the paper's own count (Table 1 gives C and C_s in parameters, no bytes)."""
    return np.array([100 * (1 - np.nanmean([h.get("sent_frac", np.nan) for h in x.history]))
                     for x in results.results[r]])


def upload_saving(results: Runs, r: float) -> np.ndarray:
    """Per seed: the share (%) of a dense float32 upload that FDL's (index, value) pairs save: the
    bytes on the wire, each sent value with its index (8 bytes against 4 per dense value)."""
    out = []
    for x in results.results[r]:
        dense = 4 * count_parameters(build_model(x.config.model)) * x.config.clients
        out.append(100 * (1 - np.mean([h["bytes_up"] for h in x.history]) / dense))
    return np.array(out)


def fig3_context(profile: str) -> tuple[float, float, float, float]:
    """What Fig. 3's claims are graded with at ``profile``: the untrained model's accuracy (%),
    corrected FDL's signal-to-noise ratio per reported value at the largest budget, and the largest
    and smallest budgets of the sweep."""
    from fedlib.models import build_model, count_parameters
    from studies.common import untrained_accuracy

    top, low = max(EPSILONS), min(EPSILONS)
    corrected = config_for("fdl_corrected", profile, 0, "iid", top)
    snr = signal_to_noise(corrected, count_parameters(build_model(corrected.model)))["signal / noise"]
    return untrained_accuracy(config_for("noldp", profile, 0, "iid")), snr, top, low


def noldp_reference(profile: str = "paper", n_seeds: int | None = None) -> np.ndarray | None:
    """FDL's non-private reference (NoLDP-FL: FedAvg, IID) at ``profile``: the final accuracies (%) of
    its committed runs, one per seed, or None while any is missing (nothing is trained here)."""
    from fedlib.results import load_cached
    from studies.common import read_roots, write_root

    roots = [*read_roots(), write_root()]
    configs = sweep(profile, n_seeds, epsilons=(max(EPSILONS),), partitions=("iid",), controls=False)
    found = [load_cached(c, roots) for c in configs[("noldp", "iid", math.inf)]]
    if any(r is None for r in found):
        return None
    return np.array([100 * r.final["test_acc"] for r in found])


def ldp_mean_floor(dims: int, clients: int, epsilon: float) -> float:
    """How large, relative to the signal, the error of ANY epsilon-LDP estimate of the clients' mean
    update must be, up to a universal constant: ``sqrt(d / (n eps^2))`` for vectors in an L2 ball
    (Duchi, Jordan & Wainwright, "Minimax optimal procedures for locally private estimation", JASA
    2018, Cor. 4 / Prop. 3: the minimax squared error is of order ``r^2 min(1, d / (n eps^2))``).
    Each round's aggregate of our repair (any repair) carries at least this much noise per unit of
    signal; it is a lower bound on every mechanism, not a property of ours."""
    return math.sqrt(dims / (clients * epsilon ** 2))


def signal_to_noise(config, dims: int) -> dict[str, float]:
    """Why corrected FDL and SignDS-FL move the model so little: per coordinate and round, the
    largest update a client can report against the noise it carries (corrected FDL: values in
    ``[-c, c]`` with Laplace noise of scale ``c 2k / eps_val``), and the share of coordinates a
    round touches at all."""
    c, k = config.ldp_clip, min(config.fdl_k, dims)
    eps_val = (1 - config.fdl_selection_share) * config.fdl_epsilon_per_round
    noise_std = c * (2 * k / eps_val) * math.sqrt(2)
    return {
        "largest reported value": c,
        "noise std per reported value": noise_std,
        "signal / noise": c / noise_std,
        "coordinates touched per round": min(1.0, config.clients * k / dims),
    }
