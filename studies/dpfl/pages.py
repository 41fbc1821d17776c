"""The configurations each DP-FL page runs, and the analyses its evidence comes from (curve
fits, the membership audit, gradient inversion, timing). The notebooks run them; the campaign
collects the configurations through :data:`PAGES`."""

from __future__ import annotations

import functools
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import optimize

from fedlib.attacks.inversion import DLGNet, defend, dlg_attack, target_gradient
from fedlib.attacks.membership import (
    AttackResult,
    dp_advantage_bound,
    loss_threshold_attack,
    per_sample_losses,
    yeom_advantage_bound,
)
from fedlib.config import Config
from fedlib.experiment import Experiment
from fedlib.privacy.accounting import epsilon_of_gaussian_rounds, rdp_epsilon
from fedlib.results import atomic_write_bytes, diverged, model_path
from fedlib.run import load_model, run
from studies.common import ConfigSet, Needs, Runs, read_roots, run_all, seeds_for, write_root
from studies.dpfl import claims
from studies.dpfl.claims import CLAIM2
from studies.dpfl.settings import (
    ARTICLE,
    EPSILONS,
    MIA_EPSILONS,
    MIA_LEARNING_EPSILONS,
    SCALES,
    SETTING,
    config_for,
    mia_config,
    mia_learning_config,
)


def _seeds(profile: str, n_seeds: int | None) -> list[int]:
    return seeds_for(SCALES, profile, n_seeds)


def true_epsilon(config: Config, accountant: str = "pld") -> float:
    """The run's epsilon (add/remove one client) by another accountant: ``pld`` is tight for
    continuous Gaussian noise, ``rdp`` with dp-accounting's default (fractional) orders."""
    z = config.dp_noise_multiplier
    if z <= 0:
        return math.inf
    return epsilon_of_gaussian_rounds(
        [z] * config.rounds, config.dp_delta, q=config.client_fraction, accountant=accountant
    )


def finals(runs: Runs, key: str = "epsilon") -> pd.DataFrame:
    """One row per run: ``key`` (the run's label), seed, final accuracy in %, loss, z."""
    rows = []
    for k, rs in runs.results.items():
        for r in rs:
            rows.append(
                {
                    key: k,
                    "seed": r.config.seed,
                    "acc": 100 * r.final["test_acc"],
                    "loss": r.final["test_loss"],
                    "z": r.config.dp_noise_multiplier,
                    "final_clip": r.history[-1].get("clip", float("nan")),
                }
            )
    return pd.DataFrame(rows)


# ---- Claim 1: accuracy vs epsilon, and two curve fits ------------------------------------------
def epsilon_sweep(profile: str, n_seeds: int | None = None, epsilons=EPSILONS) -> ConfigSet:
    seeds = _seeds(profile, n_seeds)
    out: ConfigSet = {eps: [config_for(profile, eps, s) for s in seeds] for eps in epsilons}
    out[math.inf] = [config_for(profile, None, s) for s in seeds]
    return out


def log_model(eps, acc_max, alpha):
    """The article's Claim 1: ``Acc_max - alpha log(1/eps + 1)``."""
    return acc_max - alpha * np.log(1.0 / np.asarray(eps) + 1.0)


def sigmoid_model(eps, lo, hi, mid, width):
    """An alternative: a logistic curve in log(eps) between a floor ``lo`` and a ceiling ``hi``."""
    return lo + (hi - lo) / (1.0 + np.exp(-(np.log(np.asarray(eps)) - mid) / width))


MODELS = {
    "article: Acc_max - alpha log(1/eps + 1)": (log_model, lambda e, a: [a.max(), 5.0]),
    "logistic in log eps": (sigmoid_model, lambda e, a: [a.min(), a.max(), float(np.log(np.median(e))), 1.0]),
}


#: The parameters of each model, in the order the fit returns them.
PARAMETER_NAMES = {"article: Acc_max - alpha log(1/eps + 1)": ("Acc_max", "alpha"),
                   "logistic in log eps": ("floor", "ceiling", "midpoint (log eps)", "width")}


def _fit(model, p0, eps, acc):
    params, _ = optimize.curve_fit(model, eps, acc, p0=p0, maxfev=20_000)
    return params


def compare_fits(df: pd.DataFrame) -> pd.DataFrame:
    """Fit each model to (epsilon, accuracy) of every run; in-sample RMSE and leave-one-epsilon-out
    RMSE (each *interior* epsilon's runs held out and predicted by a fit on the others: an
    interpolation test; holding out the end points would test extrapolation, where a curve
    with more parameters is bound to lose)."""
    eps, acc = df["epsilon"].to_numpy(float), df["acc"].to_numpy(float)
    rows = []
    for name, (model, init) in MODELS.items():
        params = _fit(model, init(eps, acc), eps, acc)
        rmse = float(np.sqrt(np.mean((model(eps, *params) - acc) ** 2)))
        errs = []
        for held in np.unique(eps)[1:-1]:
            tr = eps != held
            try:
                p = _fit(model, init(eps[tr], acc[tr]), eps[tr], acc[tr])
                errs.extend(model(eps[~tr], *p) - acc[~tr])
            except RuntimeError:  # no convergence without this point: count it as a failure
                errs.extend(np.full((~tr).sum(), np.nan))
        rows.append(
            {
                "model": name,
                "parameters": ", ".join(f"{n} {v:.3g}"
                                        for n, v in zip(PARAMETER_NAMES[name], params, strict=True)),
                "rmse": rmse,
                "held_out_rmse": float(np.sqrt(np.nanmean(np.square(errs)))),
                "params": params,
                "fn": model,
            }
        )
    return pd.DataFrame(rows).set_index("model")


# ---- Claim 2: adaptive vs fixed clipping -------------------------------------------------------
CLIPS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

#: Adaptive clipping's target quantiles gamma: Andrew et al.'s 0.5 and two lower ones (a clip below
#: the median update norm, where the best fixed C of this federation lies).
QUANTILES = (0.1, 0.3, 0.5)

#: Server learning rates of the adaptive arms. A clipped update has norm C, so the fixed-C sweep at
#: server learning rate 1 tunes the server step (and the noise with it) over CLIPS; an adaptive clip
#: sits near a quantile of the update norms instead, so its step is tuned by the server learning
#: rate: over the same factors, relative to the fixed clip chosen near the median norm (0.5).
SERVER_LRS = tuple(round(clip / SETTING.dp_clip, 6) for clip in CLIPS)

#: The label of the adaptive arm at Andrew et al.'s defaults (gamma 0.5, server learning rate 1),
#: which the teaching page shows too.
ADAPTIVE_DEFAULT = claims.ADAPTIVE

#: The label of the runs without DP in the clip sweep (the ceiling any clipping rule is under).
NO_DP = claims.NO_DP


def adaptive_label(quantile: float, server_lr: float) -> str:
    """The label of one adaptive arm (the defaults keep :data:`ADAPTIVE_DEFAULT`)."""
    if quantile == 0.5 and server_lr == 1.0:
        return ADAPTIVE_DEFAULT
    return f"adaptive γ = {quantile:g}, server lr {server_lr:g}"


def arm_settings(label: str, runs: Runs) -> tuple[float, float]:
    """(gamma, server learning rate) of an adaptive arm, read from its configs."""
    c = runs.results[label][0].config
    return c.clip_quantile, c.server_lr


def clip_sweep(profile: str, n_seeds: int | None = None, epsilon: float = 1.0, clips=CLIPS,
               adaptive_grid: bool = True) -> ConfigSet:
    """Fixed clip norms and adaptive clipping, all at the same noise multiplier (same epsilon).

    ``adaptive_grid``: every target quantile in :data:`QUANTILES` with every server learning rate in
    :data:`SERVER_LRS` (each adaptive arm tuned as the fixed-C sweep tunes fixed clipping), and the
    runs without DP (the ceiling); else only the adaptive arm at Andrew et al.'s defaults."""
    seeds = _seeds(profile, n_seeds)
    out: ConfigSet = {
        f"fixed C = {clip:g}": [config_for(profile, epsilon, s, dp_clip=clip) for s in seeds]
        for clip in clips
    }
    grid = [(g, lr) for g in QUANTILES for lr in SERVER_LRS] if adaptive_grid else [(0.5, 1.0)]
    for g, lr in grid:
        out[adaptive_label(g, lr)] = [config_for(profile, epsilon, s, dp_clip=0.1, adaptive_clip=True,
                                                 clip_quantile=g, server_lr=lr) for s in seeds]
    if adaptive_grid:
        out[NO_DP] = [config_for(profile, None, s) for s in seeds]
    return out


def adaptive_labels(runs: Runs) -> list[str]:
    return [k for k in runs.results if str(k).startswith(ADAPTIVE_DEFAULT)]


def fixed_labels(runs: Runs) -> list[str]:
    return [k for k in runs.results if str(k).startswith("fixed C")]


def best_label(runs: Runs, labels: list[str]) -> str:
    """The label with the highest mean final accuracy over its seeds."""
    return max(labels, key=lambda k: float(np.mean(runs.by_seed(k))))


def _mean_curve(results, column: str) -> pd.Series:
    frames = [r.frame().set_index("round") for r in results]
    return pd.concat([f[column] for f in frames], axis=1).mean(axis=1).dropna()


def headroom(runs: Runs, low: float = 15.0) -> dict[str, float]:
    """What the claim asks of this federation: the accuracy ``low`` % above the best fixed C, against
    the accuracy without DP (no clipping rule under the same noise can be expected above it)."""
    best = best_label(runs, fixed_labels(runs))
    fixed = float(np.mean(runs.by_seed(best)))
    return {"best_fixed": fixed, "best_fixed_label": best, "needed": fixed * (1 + low / 100),
            "no_dp": float(np.mean(runs.by_seed(NO_DP)))}


def adaptive_clip_story(runs: Runs) -> str:
    """What the clip sweep's runs say about adaptive clipping, in paragraphs computed from them: the
    headroom the claim needs, where the default and the best adaptive arm rank among the fixed clips,
    and, for the default arm, whether its accuracy peaked and then fell while its clip, the update
    norms and the noise grew together."""
    fixed = {k: float(np.mean(runs.by_seed(k))) for k in fixed_labels(runs)}
    clips = {k: runs.results[k][0].config.dp_clip for k in fixed}
    room = headroom(runs)
    text = (f"**Headroom.** The best fixed clip ({room['best_fixed_label']}) ends at "
            f"{room['best_fixed']:.1f} %; 15 % more is {room['needed']:.1f} %, ")
    text += ("above the accuracy of the same federation without DP "
             f"({room['no_dp']:.1f} %): no clipping rule under this noise can be expected to reach the "
             "claimed gain here, whatever its settings." if room["needed"] > room["no_dp"] else
             f"below the accuracy without DP ({room['no_dp']:.1f} %), so the claimed gain is possible here.")

    def rank(acc: float) -> str:
        below, n = [k for k, a in fixed.items() if a > acc], len(fixed)
        return (f"below every fixed clip of the sweep ({n} of {n})" if len(below) == n
                else f"below {len(below)} of the {n} fixed clips" if below else "above every fixed clip")

    default = runs.results[ADAPTIVE_DEFAULT]
    acc = float(np.mean(runs.by_seed(ADAPTIVE_DEFAULT)))
    final_clip = float(np.mean([r.history[-1]["clip"] for r in default]))
    lo, hi = min(clips.values()), max(clips.values())
    where = ("above the largest fixed clip" if final_clip > hi
             else "below the smallest fixed clip" if final_clip < lo else "within the swept range")
    text += (f"\n\n**Andrew et al.'s defaults** (γ = 0.5, server learning rate 1) end at {acc:.1f} % "
             f"accuracy, {rank(acc)}, with the clip at $C = {final_clip:.3g}$ after the last round, {where} "
             f"({lo:g} to {hi:g}).")
    curve = 100 * _mean_curve(default, "test_acc")
    peak_round, peak = int(curve.idxmax()), float(curve.max())
    if peak - acc >= 2 and "noise_norm" in default[0].history[-1]:
        norms = _mean_curve(default, "update_norm_median")
        noise = _mean_curve(default, "noise_norm")
        start = max(1, len(norms) // 10)
        text += (f" Accuracy peaked at {peak:.1f} % in round {peak_round} and then fell while the clip grew. "
                 f"The median update norm grew with it, from {norms.iloc[:start].mean():.3g} in the first "
                 f"tenth of the rounds to {norms.iloc[-1]:.3g} at the end, and the noise in the server's "
                 f"step from {noise.iloc[:start].mean():.3g} to {noise.iloc[-1]:.3g}: noise proportional to "
                 "$C$ makes the model worse, its clients' next updates longer, and a clip that tracks their "
                 "median follows them up (the figure above).")
    best = best_label(runs, adaptive_labels(runs))
    g, lr = arm_settings(best, runs)
    best_acc = float(np.mean(runs.by_seed(best)))
    text += (f"\n\n**The best adaptive arm** of the {len(adaptive_labels(runs))} (γ = {g:g}, server "
             f"learning rate {lr:g}) ends at {best_acc:.1f} %, {rank(best_acc)}: "
             f"{best_acc - room['best_fixed']:+.1f} points against the best fixed clip.")
    return text


# ---- Claim 3: membership inference against DP --------------------------------------------------
def mia(profile: str, n_seeds: int | None = None) -> ConfigSet:
    """The membership audit's memorising federation: without DP, and at each replace-one budget."""
    return {
        eps: [mia_config(profile, eps, s) for s in _seeds(profile, n_seeds)] for eps in (None, *MIA_EPSILONS)
    }


def mia_learning(profile: str, n_seeds: int | None = None) -> ConfigSet:
    """The membership audit's learning federation (many clients, sampled): without DP, and at each
    replace-one budget."""
    return {eps: [mia_learning_config(profile, eps, s) for s in _seeds(profile, n_seeds)]
            for eps in (None, *MIA_LEARNING_EPSILONS)}


#: The two federations of the membership audit, as the claim 3 page labels them.
MEMORISING, LEARNING = "memorising", "learning"


def claim3_runs(profile: str, n_seeds: int | None = None) -> ConfigSet:
    """Every run of the claim 3 page, labelled (federation, epsilon)."""
    return {**{(MEMORISING, k): v for k, v in mia(profile, n_seeds).items()},
            **{(LEARNING, k): v for k, v in mia_learning(profile, n_seeds).items()}}


@functools.lru_cache(maxsize=256)
def _replace_one_pld(z: float, rounds: int, q: float, delta: float) -> float:
    return epsilon_of_gaussian_rounds([z] * rounds, delta, q=q, accountant="pld", replace_one=True)


def replace_one_epsilon(config: Config) -> float:
    """Epsilon (at ``dp_delta``) of DP-FedAvg when one client's data are replaced, which covers
    replacing any one record: the sum of clipped updates then moves by up to ``2C``. With every
    client in every round the noise ``z C`` acts as multiplier ``z / 2`` (RDP at integer orders,
    which covers fedlib's discrete noise); with Poisson sampling, by the PLD accountant's replace-one
    pair, which is for continuous Gaussian noise (so the run must use it: ``secure_noise=False``)."""
    z = config.dp_noise_multiplier
    if z <= 0:
        return math.inf
    if config.client_fraction >= 1:
        return rdp_epsilon([z / 2] * config.rounds, config.dp_delta)
    if config.secure_noise:
        raise ValueError("replace-one accounting of Poisson-sampled discrete Gaussian noise is not "
                         "established here; audit a run with secure_noise=False (continuous Gaussian noise)")
    return _replace_one_pld(z, config.rounds, config.client_fraction, config.dp_delta)


@dataclass
class AuditRow:
    epsilon: float
    attack: AttackResult | None  # None: the model diverged or stayed near chance, and is not audited
    accuracy: float
    diverged: bool = False
    learned: bool = True  # test accuracy well above chance (:func:`studies.dpfl.claims.learned`)


def audit_name(config: Config) -> str:
    """Where a config's membership-audit losses live, relative to a results folder."""
    return f"audits/{config.algorithm}-{config.key()}.json"


def save_audit_losses(result, root) -> None:
    """Compute and store (under ``root``) the per-sample losses of ``result``'s final model on its
    training images (members) and on as many held-out test images (non-members). Needs the model
    file, which stays on the machine that trained (git-ignored): the campaign calls this right
    after training, so the committed audit file is all a page needs."""
    model, params = load_model(result, result.path.parent)
    data = Experiment(result.config, torch.device("cpu")).data
    members = per_sample_losses(model, params, data.x_train, data.y_train)
    nonmembers = per_sample_losses(model, params, data.x_test, data.y_test)
    payload = {"members": [float(v) for v in members], "nonmembers": [float(v) for v in nonmembers]}
    atomic_write_bytes(root / audit_name(result.config), json.dumps(payload).encode())


def same_model(a: dict, b: dict, test_images: int) -> bool:
    """Whether two final records describe the same trained model up to float rounding: the test
    accuracy within one test image, the losses within 1e-4 relative. Another CPU (or thread count)
    rounds float32 sums differently (a train loss of 18887.3477 against 18887.3457 seen), which a
    loss-threshold audit cannot resolve; a different model moves these by far more."""
    if abs(a["test_acc"] - b["test_acc"]) > 1.0 / test_images + 1e-12:
        return False
    return all(math.isclose(a[k], b[k], rel_tol=1e-4) or (math.isnan(a[k]) and math.isnan(b[k]))
               for k in ("test_loss", "train_loss") if k in a and k in b)


def audit_losses(config: Config) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample losses of the final global model on its training images (members) and on
    as many held-out test images (non-members); cached beside the results, so the audit can
    be redone without the model file."""
    name = audit_name(config)
    for root in (*read_roots(), write_root()):
        if (root / name).exists():
            d = json.loads((root / name).read_text())
            return np.array(d["members"]), np.array(d["nonmembers"])
    result = run_all({0: [config]}).results[0][0]
    if model_path(config, result.path.parent).exists():
        save_audit_losses(result, write_root())
    else:  # a committed result without its (git-ignored) model: train it again to audit it
        with tempfile.TemporaryDirectory(prefix="fedlib-audit-") as tmp:
            again = run(config, root=Path(tmp), progress=False, device="cpu",
                        engine=str(result.meta.get("engine", "auto")))  # the same path: the same sums
            if not same_model(again.final, result.final, result.config.test_samples or 10_000):
                raise RuntimeError(f"retraining {config.algorithm}-{config.key()} to audit it gave another "
                                   f"model ({again.final} against {result.final}): the audit needs the "
                                   "original model file")
            save_audit_losses(again, write_root())
    d = json.loads((write_root() / name).read_text())
    return np.array(d["members"]), np.array(d["nonmembers"])


def membership_audit(config: Config) -> AuditRow:
    """Loss-threshold attack (Yeom et al. 2018) on the final global model: members are the
    training images, non-members the same number of held-out test images."""
    result = run_all({0: [config]}).results[0][0]
    eps = replace_one_epsilon(config)
    acc = 100 * result.final["test_acc"]
    if diverged(result.history):  # a destroyed model says nothing about what training leaks
        return AuditRow(eps, None, acc, diverged=True, learned=False)
    if not claims.learned(acc):  # nor does one that learned nothing (ten classes: chance is 10 %)
        return AuditRow(eps, None, acc, learned=False)
    members, nonmembers = audit_losses(config)
    return AuditRow(
        eps, loss_threshold_attack(members, nonmembers, seed=config.seed), 100 * result.final["test_acc"]
    )


#: The columns of :func:`bounds_table` (also when no model was audited).
BOUNDS_COLUMNS = ("epsilon", "test acc %", "AUC", "advantage", "advantage 95% CI", "TPR @ 1% FPR",
                  "article bound e^eps - 1", "tight bound")


def bounds_table(rows: list[AuditRow], delta: float) -> pd.DataFrame:
    """One row per audited model (models that diverged or stayed near chance are left out: count them
    with :func:`diverged_count` and :func:`near_chance_count`)."""
    out = []
    for r in rows:
        if r.attack is None:
            continue
        a = r.attack
        out.append(
            {
                "epsilon": r.epsilon,
                "test acc %": r.accuracy,
                "AUC": a.auc,
                "advantage": a.advantage,
                "advantage 95% CI": f"[{a.ci['advantage'][0]:.3f}, {a.ci['advantage'][1]:.3f}]",
                "TPR @ 1% FPR": a.tpr_at_1pct,
                "article bound e^eps - 1": yeom_advantage_bound(r.epsilon)
                if math.isfinite(r.epsilon)
                else math.inf,
                "tight bound": dp_advantage_bound(r.epsilon, delta) if math.isfinite(r.epsilon) else 1.0,
            }
        )
    return pd.DataFrame(out, columns=list(BOUNDS_COLUMNS))


def diverged_count(rows: list[AuditRow]) -> tuple[int, int]:
    """(diverged, all) among the private models of the audit."""
    private = [r for r in rows if math.isfinite(r.epsilon)]
    return sum(r.diverged for r in private), len(private)


def near_chance_count(rows: list[AuditRow]) -> int:
    """Private models of the audit that did not diverge but learned too little to be audited."""
    return sum(not r.learned and not r.diverged for r in rows if math.isfinite(r.epsilon))


# ---- Claim 4: gradient inversion against clipping and noise -------------------------------------
def inversion_sweep(
    noise_levels, images: int = 3, steps: int = 30, clip: float = 0.1, seed: int = 0
) -> pd.DataFrame:
    """DLG/iDLG (cosine distance, so clipping alone does not help) on single-image gradients
    of the small attack network: undefended, clipped, and clipped + noise of std
    ``sigma = z C`` for each ``z`` in ``noise_levels``. Returns MSE, PSNR and the L2 error."""
    from fedlib.data import load

    ds = load("mnist", train_samples=50, test_samples=10, seed=seed)
    x_all = ds.x_train * 0.3081 + 0.1307  # back to [0, 1]
    rows = []
    for i in range(images):
        x, y = x_all[i : i + 1], ds.y_train[i : i + 1]
        torch.manual_seed(seed + i)
        model = DLGNet()
        g = target_gradient(model, x, y)
        cases = [("none", None, 0.0), ("clip only", clip, 0.0)]
        cases += [("clip + noise", clip, z) for z in noise_levels]
        for name, c, z in cases:
            defended = defend(g, clip=c, noise_multiplier=z, seed=seed + 100 * i + 1) if c else g
            r = dlg_attack(model, defended, tuple(x.shape), x, steps=steps, seed=seed + i, distance="cosine")
            rows.append(
                {
                    "image": i,
                    "defence": name,
                    "z": z,
                    "sigma": z * (c or 0.0),
                    "mse": r.mse,
                    "l2_error": math.sqrt(r.mse * x.numel()),
                    "psnr": r.psnr,
                    "d": x.numel(),
                    "params": sum(v.numel() for v in g.values()),
                }
            )
    return pd.DataFrame(rows)


#: Bump when the inversion attack, its network or its defences change what :func:`inversion_sweep`
#: returns: the committed audits of the old version are then recomputed (:mod:`studies.audits`).
INVERSION_VERSION = 1


def inversion_audit(noise_levels, images: int = 3, steps: int = 30, clip: float = 0.1,
                    seed: int = 0) -> pd.DataFrame:
    """:func:`inversion_sweep`, computed once per configuration and read back from the committed
    audit afterwards (:func:`studies.audits.cached`): a book build attacks nothing it has."""
    from studies import audits

    config = {"noise_levels": [float(z) for z in noise_levels], "images": int(images), "steps": int(steps),
              "clip": float(clip), "seed": int(seed), "dataset": "mnist"}
    rows = audits.cached("inversion", INVERSION_VERSION, config,
                         lambda: inversion_sweep(noise_levels, images, steps, clip, seed).to_dict("records"))
    return pd.DataFrame(rows)


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


# ---- the cost of DP --------------------------------------------------------------------------
def paired_round_times(configs: dict[str, Config], rounds: int = 10) -> dict[str, np.ndarray]:
    """Wall time of ``rounds`` rounds of each config, the configs taking turns round by round
    (A, B, C, A, B, C, ...) after one warm-up round each, so that a machine that slows down or
    speeds up during the measurement affects every config alike and ``times[b][i] / times[a][i]``
    is a paired ratio. Each time is scaled to the expected number of clients (Poisson sampling
    varies the count); sequential engine, one process, evaluation not included."""
    from fedlib.engine import Executor

    exps = {name: Experiment(c, torch.device("cpu")) for name, c in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    executors = {name: Executor("sequential", e.algo, e.data.x_train, e.data.y_train)
                 for name, e in exps.items()}
    try:
        for t in range(rounds + 1):
            turn = {}
            for name, exp in exps.items():
                c = configs[name]
                t0 = time.perf_counter()
                rec = exp.round(t, executors[name])
                turn[name] = ((time.perf_counter() - t0) * c.client_fraction * c.clients / rec["clients"]
                              if rec["clients"] else None)
            if t > 0 and all(v is not None for v in turn.values()):  # keep the pairs aligned
                for name, v in turn.items():
                    times[name].append(v)
    finally:
        for ex in executors.values():
            ex.close()
    return {name: np.array(v) for name, v in times.items()}


#: Bump when :func:`paired_round_times` changes what it measures (the committed timing is then redone).
TIMING_VERSION = 1


def round_times_audit(configs: dict[str, Config], rounds: int = 10) -> tuple[dict[str, np.ndarray], dict]:
    """:func:`paired_round_times`, measured once per set of variants and read back from the committed
    audit afterwards (:mod:`studies.audits`), with the provenance of the machine that measured it: a
    timing is a fact about that machine, and a book build elsewhere shows it, not a new one."""
    from studies import audits

    config = {"variants": {name: c.key() for name, c in configs.items()}, "rounds": int(rounds)}

    def measure() -> list[dict]:
        times = paired_round_times(configs, rounds)
        return [{"variant": name, "round": i, "seconds": float(s)} for name, v in times.items()
                for i, s in enumerate(v)]

    rows, meta = audits.cached("round_times", TIMING_VERSION, config, measure, with_meta=True)
    return {name: np.array([r["seconds"] for r in rows if r["variant"] == name]) for name in configs}, meta


# ---- the setting, and the teaching page -------------------------------------------------------------
def setting(profile: str, n_seeds: int | None = None) -> ConfigSet:
    """The federation without DP (one seed): the reference every other page is read against."""
    return {"no DP": [config_for(profile, None, _seeds(profile, n_seeds)[0])]}


CLIENT_COUNTS = (250, 500, 1000)
#: The federation-size comparison at a fixed total of data: 250 clients of 60 images.
FIXED_TOTAL = 15_000


def federation_sizes(
    profile: str, n_seeds: int | None = None, epsilon: float = 1.0, client_counts=CLIENT_COUNTS
) -> ConfigSet:
    """More clients at the same budget, two ways, each with and without DP: (a) the same total data
    split among more clients (the noise effect alone); (b) 60 images per client (more clients bring
    more data too). Keys: ``(variant, clients, epsilon or None)``."""
    seeds = _seeds(profile, n_seeds)
    out: ConfigSet = {}
    for n in client_counts:
        sizes = {"same total data": FIXED_TOTAL, "60 images per client": 60 * n if 60 * n < 60_000 else 0}
        for variant, total in sizes.items():
            for eps in (None, epsilon):
                out[(variant, n, eps)] = [
                    config_for(profile, eps, s, clients=n, train_samples=total) for s in seeds
                ]
    return out


def federation_sizes_shared(runs: Runs) -> list[int]:
    """The numbers of clients at which :func:`federation_sizes`' two variants are the same runs (the
    fixed total of data gives each client 60 images there), from the runs' own configs."""
    by = {(v, n, e): rs[0].config.key() for (v, n, e), rs in runs.results.items()}
    return sorted({n for (v, n, e), key in by.items() if v == "same total data"
                   and by.get(("60 images per client", n, e)) == key})


def teaching(profile: str, n_seeds: int | None = None, epsilon: float = 1.0) -> ConfigSet:
    return {
        **epsilon_sweep(profile, n_seeds),
        **clip_sweep(profile, n_seeds, 1.0, adaptive_grid=False),
        **federation_sizes(profile, n_seeds, epsilon),
    }


#: page (notebook stem) -> the configurations it runs, with the page's default parameters.
PAGES = {
    "dpfl_setting": setting,
    "dpfl_claim1": epsilon_sweep,
    "dpfl_claim2": clip_sweep,
    "dpfl_claim3": claim3_runs,
    "dpfl_teaching": teaching,
}

#: page -> what the campaign computes from each freshly trained result of that page (``(result,
#: results folder)``), while the model file is still on the machine that trained it.
AFTER_TRAINING = {"dpfl_claim3": save_audit_losses}

#: page -> the claims its runs decide (the setting and the teaching page only show).
CLAIMS = {
    "dpfl_claim1": lambda cs: [Needs(ARTICLE["claim1"], tuple(cs))],
    "dpfl_claim2": lambda cs: [Needs(CLAIM2, tuple(cs))],
    "dpfl_claim3": lambda cs: [Needs(ARTICLE["claim3"], tuple(cs))],
}
