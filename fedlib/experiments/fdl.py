"""The FDL study (Cheng, "Federated Learning Based on Dimension Selection"): settings,
published numbers, runs and verdicts for Table 1, Fig. 3 and Fig. 4.

``PAPER`` holds the paper's published numbers (reference data, never results). The
notebooks of the FDL chapter call these functions.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedlib.config import Config, get_profile
from fedlib.experiments.moon_dpap import fmt, mean_curve
from fedlib.models import build_model, count_parameters
from fedlib.privacy.local import fdl_published_epsilon, ldp_fl_epsilon
from fedlib.run import run

#: Sec. 5.1 of the paper, plus our choices where it is silent (see CHOICES).
PAPER_SETTING = Config(
    algorithm="fedavg", dataset="mnist", model="mcmahan_cnn", clients=100, partition="iid",
    client_fraction=1.0, rounds=50, local_epochs=1, batch_size=64, lr=0.01, momentum=0.0,
    shards_per_client=2, ldp_epsilon=0.5, ldp_clip=0.001, fdl_r=0.01, fdl_th=0.8,
)

#: Settings the paper gives (field: where).
GIVEN = {"dataset": "Sec. 5.1", "model": "Sec. 5.1 (McMahan et al.'s CNN)", "clients": "Sec. 5.1",
         "partition": "Sec. 5.1 (IID and non-IID; non-IID scheme not given)", "batch_size": "Sec. 5.1",
         "lr": "Sec. 5.1", "ldp_epsilon": "Sec. 5.2 (Laplace epsilon 0.5)", "fdl_r": "Sec. 5.2",
         "fdl_th": "Sec. 5.2", "rounds": "Fig. 4 (50 rounds)"}

#: Per-profile size. The quick profile swaps the 1.66M-parameter CNN for the 79,510-parameter
#: MLP: 40+ runs of the CNN with per-round mechanisms over 1.66M dimensions do not fit a CPU.
SCALES = {
    "smoke": dict(model="mlp", clients=10, train_samples=600, test_samples=300, rounds=2, seeds=1),
    "quick": dict(model="mlp", clients=100, train_samples=12_000, test_samples=2_000, rounds=20, seeds=3),
    "paper": dict(model="mcmahan_cnn", clients=100, train_samples=0, test_samples=0, rounds=50, seeds=10),
}

#: The four methods of Fig. 3 (FDL as published) and our corrected FDL.
METHODS = {
    "noldp": ("NoLDP-FL (FedAvg)", dict(algorithm="fedavg")),
    "ldp_fl": ("LDP-FL", dict(algorithm="ldp_fl")),
    "signds_fl": ("SignDS-FL", dict(algorithm="signds_fl")),
    "fdl": ("FDL (as published)", dict(algorithm="fdl", fdl_mode="as_published")),
    "fdl_corrected": ("FDL (corrected)", dict(algorithm="fdl", fdl_mode="corrected")),
}
COLOR_KEY = {"noldp": "fedavg", "ldp_fl": "ldp_fl", "signds_fl": "signds_fl", "fdl": "fdl",
             "fdl_corrected": "dp_fedavg_adaptive"}

EPSILONS = (0.1, 0.25, 0.5, 0.75, 1.0)
R_VALUES = (0.015, 0.012, 0.010, 0.008)

#: Published numbers.
PAPER = {
    # r: (C_r / C, C_s / C, accuracy %)
    "table1": {0.015: (0.22, 0.16, 53.25), 0.012: (0.35, 0.28, 74.50), 0.010: (0.47, 0.38, 94.83),
               0.008: (0.58, 0.46, 87.46)},
    "saving": 60.0,  # "saves at least 60 % of the communication cost"
}

CHOICES = [
    ("update vs weights", "the update w_local - w_global",
     "Alg. 1 says 'parameters'; its motivation (most values near 0) is about updates"),
    ("normalisation (as published)", "divide by the client's max |update|, sent along",
     "'normalize the parameters' into [-1, 1]; the server needs the scale back"),
    ("filter", "|v| > r", "the text's w > r would drop every negative value"),
    ("Laplace scale (as published)", "2 / epsilon", "sensitivity of a value in [-1, 1]; not given"),
    ("aggregation", "sample-weighted mean, unsent dimensions count as 0", "not given (sparse FedAvg)"),
    ("non-IID", "2 label shards per client (McMahan et al. 2017)", "not described"),
    ("public clip c (LDP-FL range, corrected FDL)", 0.001,
     "about the 99.9th percentile of |update coordinate| in a first non-private round"),
    ("corrected FDL: k, budget split", "k = 100, half for selection, half for values", "our repair"),
    ("SignDS-FL", "kappa = 0.01, h = 100, rho = 0.6, eta_g = 0.01",
     "MindSpore defaults for kappa, rho; h and eta_g ours (fixed step, no private step estimate)"),
    ("quick profile", "MLP 784-100-10, 12,000 images (120 per client), 20 rounds, 1 seed",
     "the paper's CNN and 50 rounds need a GPU (paper profile)"),
]


def scale(profile: str) -> dict:
    if profile not in SCALES:
        get_profile(profile)
    return SCALES[profile]


def seeds_for(profile: str, seeds: int | None = None) -> list[int]:
    return list(range(seeds if seeds is not None else scale(profile)["seeds"]))


def config_for(method: str, profile: str, seed: int = 0, partition: str = "iid",
               epsilon: float = 0.5, **changes) -> Config:
    s = scale(profile)
    sized = {k: s[k] for k in ("model", "clients", "train_samples", "test_samples", "rounds")}
    base = PAPER_SETTING.replace(**sized, seed=seed, profile=profile,
                                 partition="shards" if partition == "noniid" else partition)
    cfg = base.replace(**METHODS[method][1])
    if method != "noldp":
        cfg = cfg.replace(ldp_epsilon=epsilon)
    return cfg.replace(**changes)


def sweep(profile: str, epsilons=EPSILONS, partitions=("iid", "noniid"), seeds: int | None = None) -> dict:
    """Every method at every epsilon and partition: ``{(method, partition, eps): [Result]}``
    (NoLDP-FL once per partition, under ``eps = inf``)."""
    out = {}
    for part in partitions:
        out[("noldp", part, math.inf)] = [run(config_for("noldp", profile, s, part), progress=False)
                                          for s in seeds_for(profile, seeds)]
        for method in ("ldp_fl", "signds_fl", "fdl", "fdl_corrected"):
            for eps in epsilons:
                out[(method, part, eps)] = [run(config_for(method, profile, s, part, eps), progress=False)
                                            for s in seeds_for(profile, seeds)]
    return out


def frame(results: dict) -> pd.DataFrame:
    rows = []
    for (method, part, eps), rs in results.items():
        for r in rs:
            last = r.history[-1]
            rows.append({"method": method, "partition": part, "epsilon": eps, "seed": r.config.seed,
                         "acc": 100 * r.final["test_acc"], "loss": r.final["test_loss"],
                         "true_eps_round": last.get("epsilon_round", 0.0),
                         "true_eps_run": last.get("epsilon_spent", 0.0),
                         "sent_frac": last.get("sent_frac", 1.0), "kept_frac": last.get("kept_frac", np.nan),
                         "bytes_up": np.mean([h["bytes_up"] for h in r.history]),
                         "bytes_dense": 4 * count_parameters(build_model(r.config.model)) * r.config.clients})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame, by=("method", "partition", "epsilon")) -> pd.DataFrame:
    g = df.groupby(list(by), sort=False)
    out = g.agg(acc_mean=("acc", "mean"), acc_std=("acc", "std"), seeds=("seed", "count"),
                true_eps_round=("true_eps_round", "first"), true_eps_run=("true_eps_run", "first"),
                sent_frac=("sent_frac", "mean"), kept_frac=("kept_frac", "mean"),
                bytes_up=("bytes_up", "mean"), bytes_dense=("bytes_dense", "first"))
    out["acc_std"] = out["acc_std"].fillna(0.0)
    return out.sort_index()


# ---- Table 1 -----------------------------------------------------------------------------------
def run_table1(profile: str, seeds: int | None = None) -> dict:
    return {r: [run(config_for("fdl", profile, s, "iid", 0.5, fdl_r=r), progress=False)
                for s in seeds_for(profile, seeds)] for r in R_VALUES}


def table1(results: dict, profile: str) -> pd.DataFrame:
    rows = []
    for r, rs in results.items():
        kept = np.mean([np.nanmean([h.get("kept_frac", np.nan) for h in x.history]) for x in rs])
        sent = np.mean([np.nanmean([h.get("sent_frac", np.nan) for h in x.history]) for x in rs])
        acc = np.array([100 * x.final["test_acc"] for x in rs])
        p_kept, p_sent, p_acc = PAPER["table1"][r]
        saving = 100 * (1 - np.mean([np.mean([h["bytes_up"] for h in x.history]) for x in rs])
                        / (4 * count_parameters(build_model(rs[0].config.model)) * rs[0].config.clients))
        rows.append({"r": r, "paper C_r/C": p_kept, "ours C_r/C": round(float(kept), 3),
                     "paper C_s/C": p_sent, "ours C_s/C": round(float(sent), 3),
                     "paper acc (%)": p_acc,
                     "ours acc (%)": fmt(acc.mean(), acc.std(ddof=1) if len(acc) > 1 else 0.0, len(acc)),
                     "upload saved vs dense (%)": round(float(saving), 1)})
    return pd.DataFrame(rows)


def published_privacy(dims: int, epsilon: float = 0.5, selected_fraction: float = 0.38) -> pd.DataFrame:
    """What each method's per-client, per-round epsilon is as the papers state it and as it
    actually is, for a model with ``dims`` parameters (FDL: the paper's C_s = 0.38 C at r = 0.01)."""
    th = round(selected_fraction * dims)
    fdl = fdl_published_epsilon(epsilon, th)
    actual = "actual (per client and round)"
    composed = f"{fdl['composed_ignoring_filter']:.3g}"
    return pd.DataFrame([
        {"method": "LDP-FL", "stated": epsilon, actual: ldp_fl_epsilon(epsilon, dims),
         "why": "epsilon per coordinate, d coordinates"},
        {"method": "SignDS-FL", "stated": epsilon, actual: epsilon,
         "why": "data-independent choice of nu: holds"},
        {"method": "FDL as published", "stated": epsilon, actual: fdl["true"],
         "why": f"data-dependent filter and scale; even without them 2 th eps = {composed}"},
        {"method": "FDL corrected", "stated": epsilon, actual: epsilon,
         "why": "public clip and k; k draws at eps_sel / k; Laplace at L1 sensitivity 2k"},
    ])


__all__ = ["CHOICES", "COLOR_KEY", "EPSILONS", "METHODS", "PAPER", "PAPER_SETTING", "R_VALUES", "SCALES",
           "config_for", "frame", "mean_curve", "published_privacy", "run_table1", "seeds_for", "summary",
           "sweep", "table1"]
