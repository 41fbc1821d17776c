"""The teaching page's privacy-accuracy explorer: four sliders (total epsilon, clip norm C, number of
clients N, sampling rate q) and what they imply, in the static HTML of the book, offline.

Nothing in it is invented: for every slider setting the noise comes from the accountant (the noise
multiplier z that spends the total epsilon over the run's rounds at rate q, RDP at integer orders,
the accountant the runs use), the noise on the average update is ``z C / (q N)`` per coordinate (and
times the square root of the model's size over all of it), the attacker's largest advantage is the
tight bound for that epsilon, and the accuracy is the committed runs' (mean and 95 % interval over
seeds) where a run of exactly that setting exists; elsewhere the explorer says that no run was made.

Built with Altair (Vega-Lite parameters bound to range inputs) and embedded with its JavaScript
inlined (``vl-convert``), so it needs no network.
"""

from __future__ import annotations

import math
from collections import defaultdict

import altair as alt
import numpy as np
import pandas as pd

from fedlib.attacks.membership import dp_advantage_bound
from fedlib.privacy.accounting import calibrate_rdp
from studies.claims import mean_ci
from studies.common import Runs

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
CLIPS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
CLIENTS = (250, 500, 1000, 2500, 10000)
RATES = (0.01, 0.03, 0.1, 0.3, 1.0)
DELTA = 1e-5


def accuracies(runs: list[Runs]) -> dict[tuple, list[float]]:
    """Final accuracies (%) of private DP-FedAvg runs with fixed clipping and 60 images per client,
    keyed by (total epsilon, C, N, q); the label of each run set is its total epsilon or a clip label."""
    out: dict[tuple, list[float]] = defaultdict(list)
    for rs in runs:
        for label, results in rs.results.items():
            for r in results:
                c = r.config
                if c.adaptive_clip or c.dp_noise_multiplier <= 0:
                    continue
                if c.train_samples not in (0, 60 * c.clients):
                    continue  # the fixed-total-data variant: another setting
                eps = _epsilon_of(label)
                if eps is not None:
                    out[(eps, c.dp_clip, c.clients, c.client_fraction)].append(100 * r.final["test_acc"])
    return out


def _epsilon_of(label) -> float | None:
    """The total epsilon a page's run label names (the epsilon sweep's key, or a federation-size key
    ``(variant, N, epsilon)``); clip-sweep labels run at epsilon 1."""
    if isinstance(label, (int, float)) and math.isfinite(label):
        return float(label)
    if isinstance(label, tuple) and len(label) == 3 and label[2] is not None:
        return float(label[2])
    if isinstance(label, str) and label.startswith("fixed C"):
        return 1.0
    return None


def explorer_frame(rounds: int, dims: int, acc: dict[tuple, list[float]]) -> pd.DataFrame:
    """One row per slider setting, with everything the explorer shows for it."""
    z = {(e, q): calibrate_rdp(e, DELTA, rounds, q=q) for e in EPSILONS for q in RATES}
    rows = []
    for ie, e in enumerate(EPSILONS):
        adv = dp_advantage_bound(e, DELTA)
        for ic, c in enumerate(CLIPS):
            for i_n, n in enumerate(CLIENTS):
                for iq, q in enumerate(RATES):
                    sigma = z[(e, q)] * c / (q * n)
                    runs = acc.get((e, c, n, q), [])
                    if len(runs) >= 2:
                        m, lo, hi = mean_ci(runs)
                        acc_text = f"accuracy {m:.1f} % [{lo:.1f}, {hi:.1f}] over {len(runs)} committed runs"
                    elif runs:
                        acc_text = f"accuracy {runs[0]:.1f} % (one committed run)"
                    else:
                        acc_text = "accuracy: no committed run at this setting"
                    rows.append({
                        "eps_i": ie, "clip_i": ic, "clients_i": i_n, "rate_i": iq,
                        "epsilon": e, "C": c, "N": n, "q": q,
                        "sigma": sigma, "line1": f"total ε = {e:g} over {rounds} rounds (δ = 1e-5)",
                        "line2": f"clip C = {c:g}, N = {n:,} clients, q = {q:g} ({q * n:,.0f} per round)",
                        "line3": f"noise multiplier z = {z[(e, q)]:.3g} (the accountant)",
                        "line4": f"noise std on the average update: {sigma:.3g} per coordinate",
                        "line5": f"its norm over the model's {dims:,} coordinates: "
                                 f"{sigma * math.sqrt(dims):.3g}",
                        "line6": f"largest membership-attack advantage: {adv:.3f}",
                        "line7": acc_text,
                    })
    return pd.DataFrame(rows)


#: The value each slider position stands for, as the explorer shows it beside the slider.
SLIDER_VALUES: dict[str, list[str]] = {
    "eps_i": [f"ε = {e:g}" for e in EPSILONS], "clip_i": [f"C = {c:g}" for c in CLIPS],
    "clients_i": [f"N = {n:,}" for n in CLIENTS], "rate_i": [f"q = {q:g}" for q in RATES]}


def explorer_chart(frame: pd.DataFrame) -> alt.Chart:
    """Sliders over the grid's indices (:func:`explorer_html` shows each one's value beside it); a
    readout of the selected setting above the noise on the average update against epsilon for the
    selected C, N and q, the selected epsilon marked. One column, drawn at the width of the book's
    content column, so that nothing is scaled down."""
    def slider(name: str, values, label: str) -> alt.Parameter:
        return alt.param(name=name, value=values.index(_default[name]),
                         bind=alt.binding_range(min=0, max=len(values) - 1, step=1, name=label))

    _default = {"eps_i": 1.0, "clip_i": 0.5, "clients_i": 1000, "rate_i": 0.1}
    pe = slider("eps_i", list(EPSILONS), "total ε ")
    pc = slider("clip_i", list(CLIPS), "clip norm C ")
    pn = slider("clients_i", list(CLIENTS), "clients N ")
    pq = slider("rate_i", list(RATES), "sampling rate q ")
    base = alt.Chart(frame)
    others = "datum.clip_i == clip_i && datum.clients_i == clients_i && datum.rate_i == rate_i"
    selected = f"datum.eps_i == eps_i && {others}"
    lines = [f"line{i}" for i in range(1, 8)]
    readout = (
        base.transform_filter(selected)
        .transform_fold(lines, as_=["line", "text"])
        .mark_text(align="left", baseline="middle", fontSize=14)
        .encode(y=alt.Y("line:N", sort=lines, axis=None), x=alt.value(0), text="text:N")
        .properties(width=560, height=190, title="The selected setting")
    )
    curve = base.transform_filter(others)
    line = curve.mark_line(point=True, color="#1f77b4").encode(
        x=alt.X("epsilon:Q", scale=alt.Scale(type="log"), title="total ε",
                axis=alt.Axis(values=list(EPSILONS), format="~g")),
        y=alt.Y("sigma:Q", scale=alt.Scale(type="log"), title="noise std on the average update",
                axis=alt.Axis(tickCount=5, format="~g", labelOverlap="greedy")),
        tooltip=["epsilon", "sigma"],
    )
    mark = (curve.transform_filter("datum.eps_i == eps_i")
            .mark_point(size=160, color="#d62728", filled=True).encode(x="epsilon:Q", y="sigma:Q"))
    plot = (line + mark).properties(width=520, height=220, title="Noise against the budget")
    return (alt.vconcat(readout, plot).add_params(pe, pc, pn, pq)
            .configure_axis(labelFontSize=12, titleFontSize=13).configure_title(fontSize=14))


def explorer_html(chart: alt.Chart, div_id: str = "privacy-explorer",
                  slider_values: dict[str, list[str]] | None = None) -> str:
    """The chart as an HTML fragment for a page: the Vega-Embed bundle (Vega and Vega-Lite included,
    from ``vl-convert``) inlined, so it works offline, then the chart drawn as SVG. Vega shows a
    range slider's raw position beside it; for each parameter in ``slider_values`` (default
    :data:`SLIDER_VALUES`) the page shows the value that position stands for instead."""
    import json

    import vl_convert as vlc

    spec = chart.to_dict()
    from altair.utils._importers import vl_version_for_vl_convert

    bundle = vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())
    if "</script" in bundle:  # would end the script element early
        bundle = bundle.replace("</script", "<\\/script")
    options = {"renderer": "svg", "actions": False, "mode": "vega-lite"}
    values = json.dumps(SLIDER_VALUES if slider_values is None else slider_values)
    # after drawing: hide Vega's position read-out of each slider and show the value instead,
    # updated whenever the parameter changes
    show_values = (f"var values = {values};"
                   "Object.keys(values).forEach(function (name) {"
                   f"  var input = document.querySelector('#{div_id} input[name=\"' + name + '\"]');"
                   "  if (!input) { return; }"
                   "  if (input.nextElementSibling) { input.nextElementSibling.style.display = 'none'; }"
                   "  var shown = document.createElement('span'); shown.className = 'explorer-value';"
                   "  shown.style.marginLeft = '0.5em'; input.insertAdjacentElement('afterend', shown);"
                   "  var show = function (_, i) { shown.textContent = values[name][i]; };"
                   "  show(name, result.view.signal(name)); result.view.addSignalListener(name, show);"
                   "});")
    return (f"<style>#{div_id}.vega-embed {{ width: 100%; display: flex; flex-direction: column; }}</style>\n"
            # in a function of its own: the bundle's top-level names (``_`` among them) would clash
            # with the page's other scripts; it exports window.vegaEmbed
            f'<script type="text/javascript">(function () {{\n{bundle}\n}})();</script>\n'
            f'<div class="vega-visualization" id="{div_id}"></div>\n'
            f'<script type="text/javascript">(function () {{ vegaEmbed("#{div_id}", {json.dumps(spec)}, '
            f"{json.dumps(options)}).then(function (result) {{ {show_values} }}).catch(console.error); }})();"
            "</script>\n")


def accuracy_points(acc: dict[tuple, list[float]]) -> np.ndarray:
    """How many slider settings have committed runs (the explorer says so for the others)."""
    return np.array([len(v) for v in acc.values()])
