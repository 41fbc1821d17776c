"""The configurations each MOON-DPAP page runs (labelled, one config per seed), as functions of
the profile and the page's parameters. The notebooks run them; the campaign
(``python -m fedlib.tools.campaign``) collects them through :data:`PAGES`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedlib.algorithms.moon_dpap import noise_multipliers, total_epsilon
from fedlib.config import Config
from studies.common import ConfigSet, Runs, seeds_for
from studies.moon_dpap.settings import ABLATIONS, FIG1_METHODS, SCALES, TABLE1_METHODS, config_for

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


def fig2(profile: str, n_seeds: int | None = None, eps0: float = 1.0, clip: float = 0.5) -> ConfigSet:
    """Without DP; with the eq. 5 schedule at ``eps0``; with constant noise spending the same total."""
    seeds = _seeds(profile, n_seeds)
    dp = {**FIG2_DP, "dp_clip": clip}
    _, _, eps_total = fig2_schedule(profile, eps0, clip)
    return {
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
    }


def table1(profile: str, n_seeds: int | None = None) -> ConfigSet:
    return {
        f"{m}|{n}": [config_for(m, profile, s, clients=n) for s in _seeds(profile, n_seeds)]
        for m in TABLE1_METHODS
        for n in (10, 20)
    }


def table2(profile: str, n_seeds: int | None = None) -> ConfigSet:
    return {
        k: [config_for("moon_dpap", profile, s, **v) for s in _seeds(profile, n_seeds)]
        for k, v in ABLATIONS.items()
    }


FRONTIER_EPSILONS = (1.0, 10.0, 100.0, 1000.0)
FRONTIER_CLIPS = (0.1, 0.5, 2.0)


def frontier(
    profile: str,
    n_seeds: int | None = None,
    epsilons=FRONTIER_EPSILONS,
    clips=FRONTIER_CLIPS,
    clip_epsilon: float = 100.0,
) -> ConfigSet:
    """Constant noise calibrated to each total epsilon (C = 0.5), and the clip norm at one epsilon."""
    seeds = _seeds(profile, n_seeds)
    dp = dict(dp="central", dp_delta=1e-5, dp_schedule="constant")
    out = {"no DP": [config_for("moon_dpap", profile, s) for s in seeds]}
    for e in epsilons:
        out[f"eps={e:g}, C=0.5"] = [
            config_for("moon_dpap", profile, s, dp_epsilon_total=e, dp_clip=0.5, **dp) for s in seeds
        ]
    for c in clips:
        out[f"eps={clip_epsilon:g}, C={c:g}"] = [
            config_for("moon_dpap", profile, s, dp_epsilon_total=clip_epsilon, dp_clip=c, **dp) for s in seeds
        ]
    return out


ALPHAS = (0.1, 0.5, 5.0)


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
                        "run": str(label),
                        "seed": r.config.seed,
                        "final accuracy (%)": round(acc, 2),
                        "final loss": r.final["test_loss"],
                        "what": "loss NaN/inf" if bad_loss else "accuracy at chance",
                    }
                )
    return pd.DataFrame(rows, columns=["run", "seed", "final accuracy (%)", "final loss", "what"])
