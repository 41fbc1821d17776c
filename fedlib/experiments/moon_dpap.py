"""The MOON-DPAP study (Su, ICDSE 2025): settings, published numbers, runs and verdicts.

The notebooks of the MOON-DPAP chapter call these functions; they hold no logic of
their own. ``PAPER`` holds the paper's *published* numbers (reference data to compare
against, never used as results); everything in "ours" comes from :func:`fedlib.run`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedlib.config import Config, get_profile
from fedlib.run import run

#: The paper's setting (Sec. 4.1) plus our choices where it is silent (see CHOICES).
PAPER_SETTING = Config(
    algorithm="fedavg", dataset="fashionmnist", model="cnn", clients=20, partition="dirichlet",
    alpha=0.5, client_fraction=1.0, rounds=200, local_epochs=1, batch_size=32, lr=0.005,
    momentum=0.0, weight_decay=0.0, moon_mu=0.01,
)

#: Settings the paper gives (field: where).
GIVEN = {"dataset": "Sec. 4.1", "model": "Sec. 4.1 (layer types only)", "clients": "Sec. 4.1",
         "partition": "Sec. 4.1 (Dirichlet; alpha not given)", "client_fraction": "Sec. 4.1",
         "rounds": "Sec. 4.1", "local_epochs": "Sec. 4.1", "batch_size": "Sec. 4.1", "lr": "Sec. 4.1",
         "moon_mu": "Sec. 4.2 (best mu)"}

#: MOON-DPAP with every component on (the values the paper does not give are ours).
FULL_DPAP = dict(algorithm="moon_dpap", cosine_lr=True, lr_min=0.0005, dropout=0.2, prune=True,
                 prune_t_min=0.0, prune_t_max=0.005, moon_tau=0.5, tau_min=0.1, moon_mu=0.01,
                 mu_max=0.05, schedule_ramp=0.5)

#: Every setting the paper leaves unspecified: (field, value chosen, why).
CHOICES = [
    ("alpha (Dirichlet)", 0.5, "NIID-Bench's default; the paper says only 'Dirichlet non-IID'"),
    ("momentum", 0.0, "the paper says 'SGD, lr 0.005'; plain SGD as in PFLlib, which its setup matches"),
    ("CNN widths", "conv 16, 32; FC 128", "the paper gives layer types, not widths"),
    ("projection head", "MLP 128-128-64", "MOON's design (Li et al. 2021); not described in the paper"),
    ("tau: tau_max -> tau_min", "0.5 -> 0.1", "MOON's default temperature as the start"),
    ("mu: mu_min -> mu_max", "0.01 -> 0.05", "the paper's best mu = 0.01 as the start"),
    ("alpha, beta of eq. 2-3", "reach the end values at T/2", "not given"),
    ("eta_min of eq. 1", 0.0005, "one tenth of eta_max = 0.005"),
    ("dropout", 0.2, "probability not given; on the representation"),
    ("T_min, T_max of eq. 7", "0 -> 0.005", "about a third of the initial |w| scale of the FC layer"),
    ("DP: where the noise goes", "client-level, clipped update, central", "'to the gradient update process'"),
    ("DP: clip norm C", 0.5, "not given (Delta_f); sensitivity shown in the frontier notebook"),
    ("DP: delta", 1e-5, "not given; << 1 / number of clients"),
    ("DP: epsilon_0", 1.0, "not given"),
]

#: Published numbers (accuracy in %, loss).
PAPER = {
    "fig1": {"moon_dpap": (83.6, 0.44), "fedavg_gap": 4.7},
    "fig2": {"dp": (77.0, 0.71)},
    "table1": {  # algorithm: (acc 10 clients, loss 10, acc 20 clients, loss 20)
        "fedavg": (53.37, 1.22, 48.85, 1.34), "feddyn": (47.97, 1.64, 43.38, 1.83),
        "scaffold": (43.37, 1.51, 40.37, 1.57), "moon": (53.65, 1.21, 49.17, 1.34),
        "moon_dpap": (62.34, 1.13, 58.60, 1.26),
    },
    "table2": {"full": (83.71, 0.44), "no_dynamic_lr": (81.03, 0.52), "no_dropout": (80.98, 0.48),
               "no_pruning": (82.94, 0.47), "no_all_three": (78.77, 0.53)},
}

ABLATIONS = {
    "full": {},
    "no_dynamic_lr": {"cosine_lr": False},
    "no_dropout": {"dropout": 0.0},
    "no_pruning": {"prune": False},
    "no_all_three": {"cosine_lr": False, "dropout": 0.0, "prune": False},
}

FIG1_METHODS = ["fedavg", "scaffold", "feddyn", "moon", "ditto", "moon_dpap"]
TABLE1_METHODS = ["fedavg", "feddyn", "scaffold", "moon", "moon_dpap"]


def config_for(method: str, profile: str, seed: int = 0, **changes) -> Config:
    """The config of ``method`` ('moon_dpap' means every component on) under ``profile``."""
    base = PAPER_SETTING.replace(seed=seed)
    base = base.replace(**FULL_DPAP) if method == "moon_dpap" else base.replace(algorithm=method)
    return get_profile(profile).apply(base.replace(**changes))


def seeds_for(profile: str, seeds: int | None = None) -> list[int]:
    return list(range(seeds if seeds is not None else get_profile(profile).seeds))


@dataclass
class Runs:
    """Results of one or more labelled configs over seeds."""

    results: dict[str, list]

    def finals(self) -> pd.DataFrame:
        rows = []
        for label, rs in self.results.items():
            for r in rs:
                f = r.final
                rows.append({"label": label, "seed": r.config.seed, "acc": 100 * f["test_acc"],
                             "loss": f["test_loss"], **{k: f[k] for k in ("epsilon_spent", "personal_acc",
                                                                          "sparsity") if k in f}})
        return pd.DataFrame(rows)

    def summary(self) -> pd.DataFrame:
        df = self.finals()
        g = df.groupby("label", sort=False)
        out = pd.DataFrame({"acc_mean": g["acc"].mean(), "acc_std": g["acc"].std(ddof=1).fillna(0.0),
                            "loss_mean": g["loss"].mean(), "loss_std": g["loss"].std(ddof=1).fillna(0.0),
                            "seeds": g["seed"].count()})
        return out


def run_all(configs: dict[str, Iterable[Config]], progress: bool = False) -> Runs:
    return Runs({label: [run(c, progress=progress) for c in cs] for label, cs in configs.items()})


def fmt(mean: float, std: float, seeds: int, digits: int = 2) -> str:
    return f"{mean:.{digits}f}" if seeds < 2 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def numeric_verdict(paper: float, mean: float, std: float, seeds: int, profile: str,
                    tolerance: float = 2.0) -> str:
    """Reproduced when ours is within max(2 std, ``tolerance`` points) of the paper's number.
    Quick-profile numbers are not comparable to a paper's (less data, fewer rounds)."""
    if profile != "paper":
        return "not comparable at this profile (reduced data and rounds)"
    band = max(2 * std, tolerance)
    return "reproduced" if abs(mean - paper) <= band else "not reproduced"


def compare_table(summary: pd.DataFrame, paper: dict[str, tuple[float, float]], profile: str,
                  labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Paper beside ours for accuracy and loss, with the difference and a verdict per row."""
    rows = []
    for key, (p_acc, p_loss) in paper.items():
        if key not in summary.index:
            continue
        s = summary.loc[key]
        n = int(s["seeds"])
        rows.append({
            "method": (labels or {}).get(key, key),
            "paper acc (%)": p_acc, "ours acc (%)": fmt(s["acc_mean"], s["acc_std"], n),
            "diff (pts)": round(s["acc_mean"] - p_acc, 2),
            "paper loss": p_loss, "ours loss": fmt(s["loss_mean"], s["loss_std"], n, 3),
            "seeds": n, "verdict": numeric_verdict(p_acc, s["acc_mean"], s["acc_std"], n, profile),
        })
    return pd.DataFrame(rows)


def ordering_holds(summary: pd.DataFrame, better: str, worse: str) -> bool:
    return bool(summary.loc[better, "acc_mean"] > summary.loc[worse, "acc_mean"])


def close_to(summary: pd.DataFrame, a: str, b: str, points: float = 2.0) -> bool:
    return bool(abs(summary.loc[a, "acc_mean"] - summary.loc[b, "acc_mean"]) <= points)


def claim(text: str, holds: bool, evidence: str) -> dict[str, str]:
    return {"claim": text, "ours": evidence, "verdict": "reproduced" if holds else "not reproduced"}


def mean_curve(results: list) -> pd.DataFrame:
    """Mean over seeds of the per-round history (test accuracy in %, loss)."""
    frames = [r.frame().dropna(subset=["test_acc"])[["round", "test_acc", "test_loss"]] for r in results]
    df = pd.concat(frames).groupby("round").agg(["mean", "std"])
    df.columns = [f"{a}_{b}" for a, b in df.columns]
    df["acc_mean"] = 100 * df.pop("test_acc_mean")
    df["acc_std"] = 100 * df.pop("test_acc_std").fillna(0.0)
    return df.reset_index()


def epsilon_table(results: list) -> dict[str, float]:
    eps = [r.final.get("epsilon_spent", np.nan) for r in results]
    return {"epsilon_total": float(np.nanmean(eps)), "delta": results[0].config.dp_delta}


def all_results(runs: Runs) -> list:
    return [r for rs in runs.results.values() for r in rs]
