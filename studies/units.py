"""Whose privacy? One record, one client, one report (issue 77): the noise each unit of privacy puts on
a federation's averaged update, against the largest signal it can carry, from the library's own
accountant; the three papers' settings side by side; and the committed runs of each unit.

Every noise level here is the accountant's (:func:`fedlib.privacy.accounting.calibrate_rdp`, RDP at
integer orders, the accountant the runs use) or a stated bound, and every ratio compares norms over
the model's ``d`` coordinates, the signal at its largest (every clipped contribution at the clip and
aligned), so a ratio is the *least* noise per unit of signal a round carries:

* **record-level DP-SGD in each client** (one training example; add/remove one record): each client
  samples its ``m = N_data / n`` records with rate ``p = B / m`` at each of its ``K = ceil(m / B)``
  steps a round, clips each example's gradient to ``C`` and adds ``N(0, sigma^2 C^2)`` to the sum;
  ``sigma`` spends the total epsilon over ``T K`` sampled releases. Over a round a client's update moves
  by at most ``eta K C``; its noise has norm ``eta sigma C sqrt(K d) / B``, and the mean over the ``q n``
  clients of a round divides the noise by ``sqrt(q n)``: ratio ``sigma sqrt(d) / (B sqrt(K q n))``.
* **client-level, central** (a client's whole data; add/remove one client; a trusted server adds the
  noise): ``N(0, z^2 C^2)`` on the sum of the clipped updates, ``z`` spending the total over ``T``
  rounds at sampling rate ``q``; on the mean over ``q n`` clients: ratio ``z sqrt(d) / (q n)``.
* **client-level, local** (each client adds the central mechanism's noise to its own update, trusting
  nobody): the mean of ``q n`` noisy updates carries ``z C sqrt(d) / sqrt(q n)``; ``z`` without the
  amplification of sampling (a client's own release is seen): ratio ``z sqrt(d) / sqrt(q n)``.
* **local DP on the reports** (pure epsilon-LDP of each client's report every round, epsilon per round
  the total over ``T`` by composition): no mechanism does better than the minimax bound of Duchi,
  Jordan and Wainwright (2018), ``sqrt(d / (q n eps_round^2))`` times the signal
  (:func:`studies.fdl.pages.ldp_mean_floor`), up to a constant.

A ratio above 1 means a round's noise is larger than anything the clients can say; training then
needs many rounds to average it away, and below a point it cannot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedlib.privacy.accounting import calibrate_rdp
from studies.fdl.pages import ldp_mean_floor

DELTA = 1e-5


@dataclass(frozen=True)
class Unit:
    """A unit of privacy: what one change of the data is (its neighbouring relation), who adds the
    noise, and what a guarantee at that unit protects."""

    name: str
    protects: str
    relation: str
    noise_by: str


UNITS = {
    "record": Unit("record-level DP-SGD", "one training example of one client", "add/remove one record",
                   "each client, at every local step"),
    "central": Unit("client-level, central", "a client's whole data", "add/remove one client",
                    "a trusted server, once a round"),
    "local": Unit("client-level, local", "a client's whole data, from everyone", "add/remove one client",
                  "each client, on its own update, once a round"),
    "report": Unit("local DP on the reports", "a client's whole report, from everyone",
                   "any two reports (pure epsilon-LDP)", "each client, on its report, once a round"),
}


@dataclass(frozen=True)
class Federation:
    """What the noise of each unit depends on: clients ``n``, model size ``d``, total epsilon over
    ``rounds`` (delta :data:`DELTA`), sampling rate ``q`` of clients per round, minibatch ``batch`` and
    the data ``samples`` shared among the clients (records per client ``samples / n``)."""

    clients: int
    dims: int
    epsilon: float
    rounds: int
    q: float = 1.0
    batch: int = 32
    samples: int = 60_000

    @property
    def records(self) -> int:
        return max(1, self.samples // self.clients)

    @property
    def steps(self) -> int:
        """``K``: local steps a round of one epoch takes (record-level DP-SGD's releases a round)."""
        return max(1, math.ceil(self.records / self.batch))


@functools.lru_cache(maxsize=4096)
def _calibrate(epsilon: float, releases: int, q: float) -> float:
    return calibrate_rdp(epsilon, DELTA, releases, q=q)


def noise_multiplier(unit: str, f: Federation) -> float:
    """The accountant's noise multiplier for ``unit`` to spend ``f.epsilon`` over the run (record-level:
    ``sigma`` over ``T K`` Poisson-sampled steps at rate ``B / m``; client-level central: ``z`` over ``T``
    rounds at rate ``q``; local: ``z`` over ``T`` rounds without sampling); NaN for the reports (pure
    epsilon-LDP has no multiplier)."""
    if unit == "record":
        rate = min(1.0, f.batch / f.records)
        return _calibrate(f.epsilon, f.rounds * f.steps, rate)
    if unit == "central":
        return _calibrate(f.epsilon, f.rounds, f.q)
    if unit == "local":
        return _calibrate(f.epsilon, f.rounds, 1.0)
    if unit == "report":
        return math.nan
    raise KeyError(f"unknown unit {unit!r}; choose from {', '.join(UNITS)}")


def noise_to_signal(unit: str, f: Federation) -> float:
    """The norm of the noise on a round's averaged update over the largest norm of its signal, for
    ``unit`` in federation ``f`` (the module's formulas)."""
    per_round = f.q * f.clients
    if unit == "report":
        return ldp_mean_floor(f.dims, max(1, round(per_round)), f.epsilon / f.rounds)
    z = noise_multiplier(unit, f)
    if unit == "record":
        return z * math.sqrt(f.dims) / (f.batch * math.sqrt(f.steps * per_round))
    if unit == "central":
        return z * math.sqrt(f.dims) / per_round
    return z * math.sqrt(f.dims) / math.sqrt(per_round)


def sweep(base: Federation, field: str, values) -> pd.DataFrame:
    """One row per (unit, value of ``field``): the federation ``base`` with ``field`` set to the value,
    the unit's noise multiplier and its noise-to-signal ratio."""
    from dataclasses import replace

    rows = []
    for v in values:
        f = replace(base, **{field: v})
        for unit in UNITS:
            rows.append({"unit": unit, field: v, "noise multiplier": noise_multiplier(unit, f),
                         "noise / signal": noise_to_signal(unit, f)})
    return pd.DataFrame(rows)


#: The three papers' federations, in their own terms (total epsilon over their rounds; FDL's epsilon is
#: per round in the paper: 1 a round over 50 rounds is 50 in total by composition).
def paper_federations() -> dict[str, Federation]:
    from fedlib.models import build_model, count_parameters

    def d(model: str, proj: int = 0) -> int:
        return count_parameters(build_model(model, proj_dim=proj))

    return {
        "MOON-DPAP": Federation(clients=20, dims=d("cnn", 64), epsilon=10.0, rounds=200, q=1.0, batch=32),
        "FDL": Federation(clients=100, dims=d("mcmahan_cnn"), epsilon=50.0, rounds=50, q=1.0, batch=32),
        "DP-FL analysis": Federation(clients=1000, dims=d("mlp"), epsilon=1.0, rounds=100, q=0.1, batch=10),
    }


def papers_table(feds: dict[str, Federation] | None = None) -> pd.DataFrame:
    """Each paper's federation and each unit's noise-to-signal ratio there."""
    feds = feds or paper_federations()
    rows = []
    for paper, f in feds.items():
        row = {"paper": paper, "clients n": f.clients, "model size d": f.dims, "rounds T": f.rounds,
               "sampling q": f.q, "total epsilon": f.epsilon}
        for unit, u in UNITS.items():
            row[u.name] = noise_to_signal(unit, f)
        rows.append(row)
    return pd.DataFrame(rows)


# ---- the committed runs of each unit (read only, never trained) -------------------------------------
def committed_runs() -> pd.DataFrame:
    """The runs this study committed for each unit at the papers' settings, read from the results store
    (``paper`` where complete, else ``quick``; labelled): MOON-DPAP's readings of Fig. 2, FDL's repair
    under local DP on the reports with its controls, and DP-FL's DP-FedAvg at its budgets. Final
    accuracy over seeds; an empty list where a unit has no run."""
    from fedlib.results import load_cached
    from studies.common import read_roots, write_root
    from studies.dpfl import pages as dpfl_pages
    from studies.fdl import pages as fdl_pages
    from studies.moon_dpap import pages as moon_pages

    roots = [*read_roots(), write_root()]

    def found(configs) -> list:
        rs = [load_cached(c, roots) for c in configs]
        return rs if rs and all(r is not None for r in rs) else []

    rows = []

    def add(paper: str, unit: str, what: str, make) -> None:
        for profile in ("paper", "quick"):
            try:
                rs = found(make(profile))
            except KeyError:
                rs = []
            if rs:
                acc = np.array([100 * r.final["test_acc"] for r in rs])
                eps = rs[0].history[-1].get("epsilon_spent")
                rows.append({"paper": paper, "unit": UNITS[unit].name, "run": what, "profile": profile,
                             "seeds": len(rs), "final accuracy (%)": float(acc.mean()),
                             "epsilon spent": float(eps) if eps is not None else math.nan})
                return

    add("MOON-DPAP", "central", "Fig. 2, eq. 5 schedule (epsilon_0 = 1)",
        lambda p: moon_pages.fig2(p)[moon_pages.CENTRAL])
    add("MOON-DPAP", "record", "Fig. 2, record-level DP-SGD at the tuned setting",
        lambda p: moon_pages.fig2(p)[moon_pages.RECORD_TUNED_LABEL])
    from studies.fdl.settings import EPSILONS as FDL_EPSILONS

    top = max(FDL_EPSILONS)
    labels = fdl_pages.repair_labels(top)
    add("FDL", "report", f"our repair of FDL, epsilon {top:g} per round",
        lambda p: fdl_pages.sweep(p)[labels["repair"]])
    for eps in (1.0, 10.0):
        add("DP-FL analysis", "central", f"DP-FedAvg, total epsilon {eps:g}",
            lambda p, eps=eps: dpfl_pages.epsilon_sweep(p)[eps])
    return pd.DataFrame(rows, columns=["paper", "unit", "run", "profile", "seeds", "final accuracy (%)",
                                       "epsilon spent"])


# ---- the explorer -----------------------------------------------------------------------------------
EXPLORER_CLIENTS = (10, 20, 100, 1_000, 10_000)
EXPLORER_EPSILONS = (1.0, 3.0, 10.0, 30.0, 100.0)
EXPLORER_ROUNDS = 200


def explorer_dims() -> dict[str, int]:
    """The three papers' models by size: DP-FL's MLP, MOON-DPAP's CNN (with MOON's projection head) and
    FDL's McMahan CNN."""
    from fedlib.models import build_model, count_parameters

    return {"MLP (DP-FL)": count_parameters(build_model("mlp")),
            "CNN (MOON-DPAP)": count_parameters(build_model("cnn", proj_dim=64)),
            "CNN (FDL)": count_parameters(build_model("mcmahan_cnn"))}


def explorer_frame(accuracy: dict[tuple, str] | None = None) -> pd.DataFrame:
    """One row per explorer setting (clients, model, total epsilon over :data:`EXPLORER_ROUNDS` rounds,
    unit; every client in every round, 60,000 examples shared, batch 32), with what the explorer shows:
    the accountant's noise multiplier, the ratio, and the committed accuracy where a run of exactly that
    setting exists (``accuracy``: (unit, n, d, epsilon) -> text)."""
    accuracy = accuracy or {}
    dims = explorer_dims()
    rows = []
    for i_n, n in enumerate(EXPLORER_CLIENTS):
        for i_d, (model, d) in enumerate(dims.items()):
            for i_e, e in enumerate(EXPLORER_EPSILONS):
                f = Federation(clients=n, dims=d, epsilon=e, rounds=EXPLORER_ROUNDS)
                for i_u, (unit, u) in enumerate(UNITS.items()):
                    z = noise_multiplier(unit, f)
                    ratio = noise_to_signal(unit, f)
                    who = f"{u.name}: protects {u.protects} ({u.relation}); noise added by {u.noise_by}"
                    how = (f"noise multiplier from the accountant: {z:.3g}" if math.isfinite(z) else
                           f"pure ε-LDP, {e / EXPLORER_ROUNDS:.3g} per round: no multiplier (a lower bound)")
                    rows.append({
                        "clients_i": i_n, "model_i": i_d, "eps_i": i_e, "unit_i": i_u,
                        "unit": unit, "n": n, "d": d, "epsilon": e, "ratio": ratio, "z": z,
                        "line1": who,
                        "line2": f"n = {n:,} clients, {model}: d = {d:,}; total ε = {e:g} over "
                                 f"{EXPLORER_ROUNDS} rounds (δ = 1e-5)",
                        "line3": how,
                        "line4": f"noise on the averaged update / largest signal: {ratio:,.3g}",
                        "line5": ("the noise is below the signal" if ratio < 1 else
                                  f"the noise is {ratio:,.0f} times the largest signal, every round"),
                        "line6": accuracy.get((unit, n, d, e), "no committed run at this setting"),
                    })
    return pd.DataFrame(rows)


#: The explorer's sliders: the value each position stands for (shown beside the slider).
def slider_values() -> dict[str, list[str]]:
    return {"clients_i": [f"n = {n:,}" for n in EXPLORER_CLIENTS],
            "model_i": [f"{m}: d = {d:,}" for m, d in explorer_dims().items()],
            "eps_i": [f"ε = {e:g}" for e in EXPLORER_EPSILONS],
            "unit_i": [f"unit = {u.name}" for u in UNITS.values()]}


def explorer_chart(frame: pd.DataFrame):
    """Four sliders (clients, model, total epsilon, unit): the selected setting's readout above every
    unit's ratio against the number of clients for the selected model and epsilon (log-log), the
    selected unit's curve marked, and the line where the noise equals the signal."""
    import altair as alt

    def slider(name: str, count: int, default: int, label: str):
        return alt.param(name=name, value=default,
                         bind=alt.binding_range(min=0, max=count - 1, step=1, name=label))

    dims = explorer_dims()
    pn = slider("clients_i", len(EXPLORER_CLIENTS), EXPLORER_CLIENTS.index(20), "clients n ")
    pd_ = slider("model_i", len(dims), 1, "model ")
    pe = slider("eps_i", len(EXPLORER_EPSILONS), EXPLORER_EPSILONS.index(10.0), "total ε ")
    pu = slider("unit_i", len(UNITS), 0, "unit ")
    base = alt.Chart(frame)
    selected = ("datum.clients_i == clients_i && datum.model_i == model_i && datum.eps_i == eps_i && "
                "datum.unit_i == unit_i")
    lines = [f"line{i}" for i in range(1, 7)]
    readout = (base.transform_filter(selected).transform_fold(lines, as_=["line", "text"])
               .mark_text(align="left", baseline="middle", fontSize=13)
               .encode(y=alt.Y("line:N", sort=lines, axis=None), x=alt.value(0), text="text:N")
               .properties(width=560, height=170, title="The selected setting"))
    curves = base.transform_filter("datum.model_i == model_i && datum.eps_i == eps_i")
    line = curves.mark_line(point=True).encode(
        x=alt.X("n:Q", scale=alt.Scale(type="log"), title="clients n", axis=alt.Axis(format="~s")),
        y=alt.Y("ratio:Q", scale=alt.Scale(type="log"), title="noise / largest signal, each round",
                axis=alt.Axis(format="~g")),
        color=alt.Color("unit:N", title="unit"),
        opacity=alt.condition("datum.unit_i == unit_i", alt.value(1.0), alt.value(0.35)),
        tooltip=["unit", "n", "ratio"])
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(y="y:Q")
    mark = (base.transform_filter(selected).mark_point(size=170, color="#d62728", filled=True)
            .encode(x="n:Q", y="ratio:Q"))
    plot = (line + one + mark).properties(width=430, height=230, title="Every unit, this model and budget")
    return (alt.vconcat(readout, plot).add_params(pn, pd_, pe, pu)
            .configure_axis(labelFontSize=12, titleFontSize=13).configure_title(fontSize=14))


# ---- the page's figures and words -----------------------------------------------------------------------
STYLES = {"record": dict(color="C0", marker="s"), "central": dict(color="C3", marker="o"),
          "local": dict(color="C1", marker="^"), "report": dict(color="C2", marker="D")}


def plot_sweep(ax, table: pd.DataFrame, field: str, xlabel: str) -> None:
    """Each unit's ratio against ``field`` (log-log), with the line where the noise equals the signal."""
    for unit, u in UNITS.items():
        t = table[table["unit"] == unit].sort_values(field)
        ax.plot(t[field], t["noise / signal"], label=u.name, **STYLES[unit])
    ax.axhline(1.0, color="k", ls="--", lw=1, label="noise = largest signal")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="noise / largest signal, each round")
    ax.grid(alpha=0.3, which="both")


def below_signal(table: pd.DataFrame, field: str, unit: str) -> list[tuple[float, float]]:
    """The stretches of ``field``'s grid (first and last value of each) where ``unit``'s ratio is below 1:
    a ratio need not fall monotonically (record-level DP-SGD with more clients has fewer records each)."""
    t = table[table["unit"] == unit].sort_values(field)
    runs: list[tuple[float, float]] = []
    start = last = None
    for value, below in zip(t[field], t["noise / signal"] < 1, strict=True):
        if below:
            start = value if start is None else start
            last = value
        elif start is not None:
            runs.append((start, last))
            start = None
    if start is not None:
        runs.append((start, last))
    return runs


def crossings_sentence(table: pd.DataFrame, field: str, what: str) -> str:
    """Where on the grid of ``field`` each unit's noise is below the largest signal, in words."""
    values = sorted(table[field].unique())
    parts = []
    for unit, u in UNITS.items():
        runs = below_signal(table, field, unit)
        if not runs:
            parts.append(f"{u.name}: nowhere on this grid")
        elif runs == [(values[0], values[-1])]:
            parts.append(f"{u.name}: everywhere on this grid")
        else:
            spans = [f"{a:,.6g}" if a == b else f"{a:,.6g} to {b:,.6g}" for a, b in runs]
            parts.append(f"{u.name}: at {what} = {' and '.join(spans)}")
    return "The noise is below the largest signal for " + "; ".join(parts) + "."


def committed_on_grid(runs: pd.DataFrame) -> dict[tuple, str]:
    """The committed runs (:func:`committed_runs`) that sit exactly on the explorer's grid (its rounds,
    one of its budgets), as the explorer's key (unit, n, d, epsilon) -> what it shows."""
    feds = paper_federations()
    names = {u.name: k for k, u in UNITS.items()}
    out = {}
    for _, r in runs.iterrows():
        fed = feds[r["paper"]]
        eps = float(round(r["epsilon spent"])) if math.isfinite(r["epsilon spent"]) else math.nan
        if fed.rounds == EXPLORER_ROUNDS and eps in EXPLORER_EPSILONS:
            out[(names[r["unit"]], fed.clients, fed.dims, eps)] = (
                f"committed: {r['run']} ({r['profile']}, {r['seeds']} seeds): "
                f"{r['final accuracy (%)']:.1f} % accuracy")
    return out
