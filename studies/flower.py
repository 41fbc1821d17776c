"""The Flower page: the same configurations trained by fedlib's engine and by Flower.

The configurations are MOON-DPAP Fig. 1's FedAvg, SCAFFOLD and MOON-DPAP runs and Fig. 2's
client-level DP run (eq. 5 schedule), so the engine's side is the committed results of those
pages. The Flower side is :func:`fedlib.flower.run_flower_many` (one simulation for all of them),
stored under ``<results>/flower/``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from fedlib.results import REPO_ROOT, Result, load_cached
from studies.common import ConfigSet, Runs, read_roots, write_root
from studies.moon_dpap import pages

LABELS = {"fedavg": "FedAvg", "scaffold": "SCAFFOLD", "moon_dpap": "MOON-DPAP"}
DP_LABEL = "MOON-DPAP, client-level DP (eq. 5)"


def configs(profile: str, n_seeds: int | None = None) -> ConfigSet:
    """The page's configurations, labelled (one per seed)."""
    f1, f2 = pages.fig1(profile, n_seeds), pages.fig2(profile, n_seeds)
    return {**{label: f1[name] for name, label in LABELS.items()},
            DP_LABEL: f2["moon_dpap (DP, eq. 5 schedule)"]}


def run_flower_all(cs: ConfigSet, seeds: int | None = None, progress: bool = False) -> Runs:
    """The Flower results of ``cs`` (of each label's first ``seeds`` configs when given):
    committed ones where they exist, the rest trained through one Flower simulation (this needs
    the optional extra: ``pip install -e '.[flower]'``)."""
    from fedlib.flower.results import flower_results_dir

    cs = {label: group[:seeds] if seeds else group for label, group in cs.items()}
    found: dict[str, Result] = {}
    missing = []
    for c in (c for group in cs.values() for c in group):
        hit = load_cached(c, [flower_results_dir(root, "simulation") for root in read_roots()])
        if hit is not None:
            found[c.key()] = hit
        else:
            missing.append(c)
    if missing:
        from fedlib.flower.simulation import run_flower_many

        for c, r in zip(missing, run_flower_many(missing, root=write_root(), progress=progress), strict=True):
            found[c.key()] = r
    return Runs({label: [found[c.key()] for c in group] for label, group in cs.items()})


def curves(engine: Runs, flower: Runs) -> pd.DataFrame:
    """Test accuracy (%) per round, label, engine and seed (long format, for plotting)."""
    rows = []
    for name, runs in (("fedlib engine", engine), ("Flower", flower)):
        for label, results in runs.results.items():
            for r in results:
                for h in r.history:
                    if h.get("test_acc") is not None:
                        rows.append({"method": label, "engine": name, "seed": r.config.seed,
                                     "round": h["round"], "accuracy": 100 * h["test_acc"]})
    return pd.DataFrame(rows)


def comparison(engine: Runs, flower: Runs) -> pd.DataFrame:
    """One row per method: final accuracy of both engines (mean and sd over seeds), the largest
    per-seed difference, seconds per round and Flower's start-up and peak memory."""
    rows = []
    for label, eng in engine.results.items():
        flo = flower.results[label]
        a = {r.config.seed: 100 * r.final["test_acc"] for r in eng}
        b = {r.config.seed: 100 * r.final["test_acc"] for r in flo}
        sd = lambda x: float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")  # noqa: E731
        rows.append({
            "method": label, "engine seeds": len(a), "Flower seeds": len(b),
            "engine acc (%)": np.mean(list(a.values())), "engine sd": sd(list(a.values())),
            "Flower acc (%)": np.mean(list(b.values())),
            "max |diff| same seed (pp)": max(abs(a[s] - b[s]) for s in b),
            "agree within noise": (agree_within_noise(list(a.values()), list(b.values()))
                                   if len(a) + len(b) >= 3 else None),
        })
    return pd.DataFrame(rows)


def timing() -> tuple[pd.DataFrame, dict] | None:
    """The latest committed measurement of both engines' time and memory
    (``data/bench/flower/``, written by ``python -m lab.flower_bench --save``): a table
    and its provenance, or None when none is committed."""
    files = sorted((REPO_ROOT / "data" / "bench" / "flower").glob("*.json"))
    if not files:
        return None
    d = json.loads(files[-1].read_text())
    table = pd.DataFrame(d["rows"]).rename(columns={"engine": "path"})
    table = table.rename(columns={"engine_name": "engine"})
    table["engine"] = table["engine"].replace({"Flower": "Flower simulation"})  # files before deployment
    table["peak memory (GiB)"] = table.pop("peak_rss_mb") / 1024
    table = table.rename(columns={"s_per_round": "s/round", "startup_s": "start-up (s)",
                                  "ratio_s_per_round": "x engine per round", "ratio_total": "x engine in all",
                                  "clientapp_processes_per_round": "ClientApp processes per round"})
    columns = ["method", "engine", "rounds", "s/round", "start-up (s)", "x engine per round",
               "x engine in all", "peak memory (GiB)", "ClientApp processes per round"]
    return table[[c for c in columns if c in table]], {
        **d["provenance"], "time": d["time"], "file": files[-1].name}


def _span(values, fmt: str) -> str:
    """``"lo to hi"`` of ``values`` in format ``fmt``, or one number when they print alike."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo} to {hi}"


def timing_summary(timing: pd.DataFrame) -> str:
    """A sentence on the measured ratios of Flower's paths to fedlib's engine (from :func:`timing`)."""
    wide = timing.pivot(index="method", columns="engine",
                        values=["s/round", "start-up (s)", "peak memory (GiB)"])
    base = "fedlib engine"
    parts = []
    for engine in [e for e in timing["engine"].unique() if e != base]:
        ratio = wide[("s/round", engine)] / wide[("s/round", base)]
        memory = wide[("peak memory (GiB)", engine)] / wide[("peak memory (GiB)", base)]
        parts.append(f"{engine} took {_span(ratio, '.2f')} times the engine's time per "
                     f"round, paid {wide[('start-up (s)', engine)].max():.0f} s of start-up once per run "
                     f"and used {_span(memory, '.1f')} times its memory")
    text = "Per configuration: " + "; ".join(parts) + "."
    per_round = {e: float(wide[("s/round", e)].div(wide[("s/round", base)]).max())
                 for e in timing["engine"].unique() if e != base}
    close = [e for e, r in per_round.items() if r < 1.5]
    slow = [e for e, r in per_round.items() if r >= 2.0]  # at least half of each round is not the training
    if close:
        text += (f" In the {' and '.join(close)} the clients' training dominates each round; what Flower "
                 "adds is start-up and the processes' memory.")
    if slow:
        text += (f" In the {' and '.join(slow)} most of a round is not training: Flower starts a fresh "
                 "ClientApp process for every message, which imports PyTorch and loads its node's data "
                 "before it trains, and each process holds its own copy of the model and data.")
    if "ClientApp processes per round" in timing:
        procs = timing["ClientApp processes per round"].dropna()
        if len(procs):
            text += (f" The deployment started {_span(procs, '.0f')} ClientApp processes per round: one per "
                     "SuperNode that plays a sampled client, which trains all of that node's clients of the "
                     "round and answers with one message.")
    text += (" What Flower buys is the real structure: the model travels to each node and back as a message "
             "every round, and the nodes could be other machines.")
    return text


#: The phases of a deployment message that fedlib's own code spends (its imports, reading the node's
#: data, the client state, training and encoding the reply); the rest is Flower's or PyTorch's import.
FEDLIB_PHASES = ("fedlib imports", "reading the node's data")
#: What fedlib's per-message overhead (its imports and reading the node's data) may take (issue 66).
FEDLIB_OVERHEAD_TARGET_S = 0.5


def message_breakdown() -> tuple[pd.DataFrame, dict] | None:
    """Per configuration, the seconds each phase of a deployment's train message takes (the latest
    committed Flower benchmark that measured them, :func:`fedlib.flower.bench.message_phases`), and
    that file's provenance; None when no committed benchmark has them."""
    for f in sorted((REPO_ROOT / "data" / "bench" / "flower").glob("*.json"), reverse=True):
        d = json.loads(f.read_text())
        rows = [r for r in d["rows"] if r.get("message_phases")]
        if rows:
            table = pd.DataFrame({r["method"]: r["message_phases"] for r in rows}).T
            return table, {**d["provenance"], "time": d["time"], "file": f.name}
    return None


def before_after() -> str:
    """A sentence comparing the latest Flower benchmark with a baseline measured on the same host the
    same day with older code (``data/bench/flower/<device>-<date>-baseline-<commit>.json``), when one is
    committed: deployment seconds per round and their ratio to the engine, both generated from the files."""
    folder = REPO_ROOT / "data" / "bench" / "flower"
    files = sorted(f for f in folder.glob("*.json") if "baseline" not in f.name)
    if not files:
        return ""
    latest = files[-1]
    base = sorted(folder.glob(f"{latest.stem}-baseline-*.json"))
    if not base:
        return ""

    def deployment(path):
        d = json.loads(path.read_text())
        return {r["method"]: (r["s_per_round"], r["ratio_s_per_round"]) for r in d["rows"]
                if r["engine_name"].startswith("Flower deployment")}, d["provenance"]["git_commit"][:7]

    now, commit_now = deployment(latest)
    before, commit_before = deployment(base[-1])
    parts = [f"{m}: {before[m][0]:.1f} s a round ({before[m][1]:.1f} times the engine) at `{commit_before}`, "
             f"{now[m][0]:.1f} s ({now[m][1]:.1f} times) at `{commit_now}`" for m in now if m in before]
    return ("On the same host the same day, a deployment round before and after fedlib's ClientApp stopped "
            "importing what it does not use and its ServerApp stopped waiting 3 s between asks for "
            "replies: " + "; ".join(parts) + ".")


def breakdown_summary(table: pd.DataFrame) -> str:
    """What the breakdown says, generated from it: fedlib's own share of a message against its target,
    and where the rest goes."""
    own = table[list(FEDLIB_PHASES)].sum(axis=1)
    total = table.sum(axis=1)
    flower = total - own - table["training"] - table["PyTorch import"]
    verdict = "within" if float(own.max()) <= FEDLIB_OVERHEAD_TARGET_S else "above"
    return (f"What fedlib's code adds to a message before it trains, its imports and reading the node's "
            f"data, took {_span(own, '.2f')} s ({verdict} the {FEDLIB_OVERHEAD_TARGET_S:g} s it may take); "
            f"PyTorch's import {_span(table['PyTorch import'], '.1f')} s, which every fresh process that "
            f"trains with it pays; training {_span(table['training'], '.1f')} s; and Flower's own work "
            f"(scheduling the message, starting the ClientApp process and its imports, carrying the reply "
            f"back) "
            f"{_span(flower, '.1f')} s of the {_span(total, '.1f')} s a message took.")


def dp_table(rows: list[dict]) -> pd.DataFrame:
    """The DP cross-check (:func:`fedlib.flower.dp_check.cross_check`) as a readable table."""
    t = pd.DataFrame(rows)
    return pd.DataFrame({"implementation": t["implementation"],
                         "largest difference of the noiseless mean": t["max_mean_diff"],
                         "noise std": t["noise_std"], "target std zC/m": t["target_std"],
                         "noise std / target": t["noise_std"] / t["target_std"]})


def agree_within_noise(engine_pct: list[float], flower_pct: list[float], margin_pp: float = 0.5) -> bool:
    """Whether two engines' final accuracies (%, one per seed) agree within noise: the difference
    of their means is at most twice its standard error, from the seed-to-seed spread (pooled over
    the engines' seeds; at least two seeds needed in all) plus ``margin_pp`` for float rounding,
    which the chaotic dynamics of training can amplify."""
    a, b = np.asarray(engine_pct, float), np.asarray(flower_pct, float)
    if len(a) + len(b) < 3:
        raise ValueError("agreement within noise needs a seed-to-seed spread: at least 3 runs in all")
    pooled = np.concatenate([a - a.mean(), b - b.mean()])
    sd = np.sqrt((pooled**2).sum() / (len(a) + len(b) - 2))
    se = sd * np.sqrt(1 / len(a) + 1 / len(b))
    return bool(abs(a.mean() - b.mean()) <= 2 * se + margin_pp)


#: Two runs of one seed that end closer than this (percentage points) are the same run to the
#: table's precision (it shows one decimal).
SAME_PP = 0.05


def agreement_text(table: pd.DataFrame, chance_pct: float = 10.0) -> str:
    """What the side-by-side table says, in words generated from it (issue 43: no sentence states
    more, or other, than its numbers): how far apart each seed's two runs end without and with DP,
    and why agreement is judged against the seed-to-seed noise."""
    plain = table[table["method"] != DP_LABEL]
    text = (f"Without privacy noise, the two runs of one seed end at most "
            f"{plain['max |diff| same seed (pp)'].max():.2f} percentage points apart.")
    if DP_LABEL not in set(table["method"]):
        return text
    dp = table.set_index("method").loc[DP_LABEL]
    diff = float(dp["max |diff| same seed (pp)"])
    eng, flo = float(dp["engine acc (%)"]), float(dp["Flower acc (%)"])
    text += f" With client-level DP the runs end at {eng:.1f} % (engine) and {flo:.1f} % (Flower)"
    text += f", near the {chance_pct:g} % of chance." if eng < 2 * chance_pct else "."
    why = ("Float rounding (one thread per client through Flower, several in the engine) can separate a "
           "seed's two runs, most of all once noise has made training chaotic, which is why agreement is "
           "judged against the seed-to-seed noise rather than seed by seed.")
    if diff < SAME_PP:
        return f"{text} Each seed's two runs agree here too (largest difference {diff:.2f} points). {why}"
    return f"{text} A seed's two runs end up to {diff:.1f} points apart. {why}"
