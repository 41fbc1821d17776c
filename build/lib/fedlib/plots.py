"""Figures shared by every chapter: one colour per algorithm, labelled axes, provenance."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from fedlib.results import Result

#: Pixels per inch of every figure of the book (the PNG the notebooks show).
DPI = 100
#: The smallest text a figure of the book draws, in points (footers, dense legends); the style's own
#: sizes are larger. At :data:`DPI` it is 12.5 px in the saved image.
MIN_FONT_PT = 9
#: The smallest text a reader should meet, in CSS px, after the page scales the figure down.
MIN_TEXT_PX = 9
#: A figure shown at less than this fraction of its pixel width draws text under MIN_TEXT_PX:
#: 9 px / (9 pt x 100/72 px per pt) = 0.72. The browser check holds every figure of the book to it.
MIN_SCALE = MIN_TEXT_PX / (MIN_FONT_PT * DPI / 72)
#: The widest figure (inches) that the book's content column (about 660 px at a 1280 px window)
#: shows at MIN_SCALE or more: 660 / 0.72 / 100 dpi = 9.2 in, less a margin for what a tight
#: bounding box adds (legends outside the axes, the footer).
MAX_WIDTH_IN = 9.0

#: The book's figure style, set when this module loads: no text under MIN_FONT_PT.
STYLE = {"figure.dpi": DPI, "savefig.dpi": DPI, "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11,
         "xtick.labelsize": 10, "ytick.labelsize": 10, "legend.fontsize": 10, "legend.title_fontsize": 10}
plt.rcParams.update(STYLE)


def round_axis(ax) -> None:
    """Integer ticks on an axis of rounds (no 2.5, 7.5)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))

#: One colour per algorithm, used in every chapter.
ALGORITHM_ORDER = ["fedavg", "fedprox", "scaffold", "feddyn", "moon", "ditto", "moon_dpap",
                   "dp_fedavg", "dp_fedavg_adaptive", "ldp_fl", "signds_fl", "fdl"]
# One distinct colour per algorithm (tab10 and two more). Notebooks draw DP variants in
# red (C3) and orange (C1), so no algorithm uses those two.
COLORS = {"fedavg": "#1f77b4", "fedprox": "#17becf", "scaffold": "#8c564b", "feddyn": "#2ca02c",
          "moon": "#e377c2", "ditto": "#bcbd22", "moon_dpap": "#9467bd", "dp_fedavg": "#7f7f7f",
          "dp_fedavg_adaptive": "#000000", "ldp_fl": "#aec7e8", "signds_fl": "#98df8a",
          "fdl": "#393b79"}
assert set(COLORS) == set(ALGORITHM_ORDER) and len(set(COLORS.values())) == len(COLORS)
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "feddyn": "FedDyn",
          "moon": "MOON", "ditto": "Ditto", "moon_dpap": "MOON-DPAP", "dp_fedavg": "DP-FedAvg",
          "dp_fedavg_adaptive": "DP-FedAvg (adaptive clip)", "ldp_fl": "LDP-FL",
          "signds_fl": "SignDS-FL", "fdl": "FDL"}


def color(algorithm: str):
    return COLORS.get(algorithm, "0.3")


def provenance_label(result: Result) -> str:
    """'profile quick, seed 0, cpu, commit abc1234' for captions and figure footers."""
    m, c = result.meta, result.config
    return (f"profile {c.profile}, seed {c.seed}, {m.get('device', '?')}, "
            f"commit {str(m.get('git_commit', '?'))[:7]}")


def learning_curves(results: Sequence[Result], labels: Sequence[str] | None = None,
                    title: str | None = None):
    """Test accuracy and loss per round, one line per result."""
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 3.6))
    for i, r in enumerate(results):
        df = r.frame().dropna(subset=["test_acc"])
        label = labels[i] if labels else LABELS.get(r.config.algorithm, r.config.algorithm)
        kw = {"color": color(r.config.algorithm), "label": label}
        ax_acc.plot(df["round"], 100 * df["test_acc"], **kw)
        ax_loss.plot(df["round"], df["test_loss"], **kw)
    ax_acc.set(xlabel="global round", ylabel="test accuracy (%)")
    ax_loss.set(xlabel="global round", ylabel="test loss (cross-entropy)")
    round_axis(ax_acc)
    round_axis(ax_loss)
    ax_acc.legend(frameon=False)
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if results:
        add_footer(fig, provenance_label(results[0]))
    return fig


def partition_plot(counts: np.ndarray, title: str | None = None, ax=None):
    """Stacked bars: samples of each class (colour) held by each client (x)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 3.2))
    n_clients, n_classes = counts.shape
    bottom = np.zeros(n_clients)
    pal = sns.color_palette("tab10", n_classes)
    for k in range(n_classes):
        ax.bar(np.arange(n_clients), counts[:, k], bottom=bottom, color=pal[k], label=str(k), width=0.85)
        bottom += counts[:, k]
    ax.set(xlabel="client", ylabel="training samples", xticks=np.arange(n_clients))
    ax.legend(title="class", ncol=10, fontsize=MIN_FONT_PT, title_fontsize=MIN_FONT_PT, frameon=False,
              loc="upper center", bbox_to_anchor=(0.5, 1.18))
    if title:
        ax.set_title(title, pad=28)
    return ax


#: Line styles and markers cycled through the curves of one figure, so that curves that coincide
#: (Ditto's global model is FedAvg's) stay distinguishable.
_STYLES = [dict(ls="-", marker="o"), dict(ls="--", marker="s"), dict(ls=":", marker="^"),
           dict(ls="-.", marker="D"), dict(ls=(0, (5, 1)), marker="v"), dict(ls=(0, (1, 1)), marker="P")]


def mean_curves(curves: dict, title: str | None = None, footer: str | None = None,
                styles: dict | None = None, reference: dict | None = None, names: dict | None = None):
    """Test accuracy and loss per round, mean over seeds (band = +- 1 std when > 1 seed).

    ``curves`` maps a label to a frame from :func:`studies.common.mean_curve`; the label's algorithm
    (before any ' (') picks the colour unless ``styles`` gives one; ``names`` gives readable legend
    names. ``reference`` maps a legend text to a published ``(accuracy %, loss)`` drawn as
    horizontal lines (either may be None). The legend sits below the panels.
    """
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.4))
    drawn: dict[str, object] = {}
    for i, (label, df) in enumerate(curves.items()):
        key = str(label).split(" (")[0]
        name = (names or {}).get(label, LABELS.get(label, label))
        same = [n for n, other in drawn.items() if len(other) == len(df)
                and np.allclose(other["acc_mean"], df["acc_mean"], atol=0.01)]
        if same:  # a curve that lies on an earlier one: say so, or the reader sees one line short
            name = f"{name} (on {same[0]}'s curve)"
        drawn[(names or {}).get(label, LABELS.get(label, label))] = df
        # markers every ``step`` rounds, staggered from curve to curve so that curves lying on one
        # another still show each one's markers
        step = max(1, len(df) // 8)
        kw = {"color": color(key), "label": name, "markevery": ((i * step) // max(1, len(curves)), step),
              "markersize": 4, "zorder": 3, **_STYLES[i % len(_STYLES)]}
        kw.update((styles or {}).get(label, {}))
        ax_acc.plot(df["round"], df["acc_mean"], **kw)
        ax_loss.plot(df["round"], df["test_loss_mean"], **kw)
        if df["acc_std"].gt(0).any():  # bands under every line, light enough to see the lines through
            ax_acc.fill_between(df["round"], df["acc_mean"] - df["acc_std"], df["acc_mean"] + df["acc_std"],
                                color=kw["color"], alpha=0.08, lw=0, zorder=1)
    for j, (text, (acc, loss)) in enumerate((reference or {}).items()):
        # long and short dashes: the captions call every reference line dashed, and the legend tells
        # two apart
        kw = {"color": "0.25", "lw": 1.0, "ls": (0, (6, 2)) if j % 2 == 0 else (0, (3, 1.5))}
        if acc is not None:
            ax_acc.axhline(acc, label=text, **kw)
        if loss is not None:
            ax_loss.axhline(loss, **kw)
    ax_acc.set(xlabel="global round", ylabel="test accuracy (%)")
    ax_loss.set(xlabel="global round", ylabel="test loss (cross-entropy, log scale)")
    round_axis(ax_acc)
    round_axis(ax_loss)
    ax_loss.set_yscale("log")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    handles, labels = ax_acc.get_legend_handles_labels()
    # as many columns as the longest entry lets fit in the figure's width (about 6.5 px a character
    # at 9 pt and 100 dpi, 50 px for the line sample): a wider legend would widen the saved figure
    longest = max((len(x) for x in labels), default=0)
    fits = [n for n in (4, 3, 2) if n <= len(labels) and longest <= (DPI * MAX_WIDTH_IN / n - 50) / 6.5]
    ncol = next(iter(fits), 1)
    ncol = min(ncol, max(1, len(labels)))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=MIN_FONT_PT)
    if title:
        fig.suptitle(title)
    rows = (len(labels) + ncol - 1) // ncol
    fig.tight_layout(rect=(0, 0.06 + 0.045 * rows, 1, 1))
    if footer:
        add_footer(fig, footer)
    return fig


def add_footer(fig, text: str):
    """Draw ``text`` (a provenance line) under everything the figure already holds, right-aligned:
    below the axes and below any legend, also one placed outside the axes, so that nothing overprints
    it. Call it last. Saved with a tight bounding box (the notebooks' default) the image grows
    downwards to hold it."""
    from matplotlib.transforms import Bbox

    # A figure legend placed by ``loc`` alone is anchored to the figure's box, which a tight bounding
    # box moves down to the footer when the image is saved: pin it to where it is now.
    for legend in fig.legends:
        if legend.get_bbox_to_anchor() == fig.bbox:
            legend.set_bbox_to_anchor((0, 0, 1, 1), transform=fig.transFigure)
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_tightbbox(renderer) for a in fig.get_children() if a.get_visible()]
    inches = Bbox.union([b for b in boxes if b is not None and b.width > 0]).transformed(
        fig.dpi_scale_trans.inverted())
    gap = 0.04  # inches between the lowest artist and the footer's top
    return fig.text(min(0.99, inches.x1 / fig.get_figwidth()), (inches.y0 - gap) / fig.get_figheight(),
                    text, ha="right", va="top", fontsize=MIN_FONT_PT, color="0.4")


def footer(results) -> str:
    """Provenance line for a figure made from several results."""
    r = results[0]
    seeds = sorted({x.config.seed for x in results})
    return (f"profile {r.config.profile}, seeds {seeds}, {r.config.n_train:,} training samples, "
            f"{r.config.rounds} rounds, {r.meta.get('device', '?')}, "
            f"commit {str(r.meta.get('git_commit', '?'))[:7]}")
