"""Figures shared by every chapter: one colour per algorithm, labelled axes, provenance."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from fedlib.results import Result

#: One colour per algorithm, used in every chapter.
ALGORITHM_ORDER = ["fedavg", "fedprox", "scaffold", "feddyn", "moon", "ditto", "moon_dpap",
                   "dp_fedavg", "dp_fedavg_adaptive", "ldp_fl", "signds_fl", "fdl"]
_PALETTE = sns.color_palette("tab20", len(ALGORITHM_ORDER))
COLORS = dict(zip(ALGORITHM_ORDER, _PALETTE, strict=True))
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
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, r in enumerate(results):
        df = r.frame().dropna(subset=["test_acc"])
        label = labels[i] if labels else LABELS.get(r.config.algorithm, r.config.algorithm)
        kw = {"color": color(r.config.algorithm), "label": label}
        ax_acc.plot(df["round"], 100 * df["test_acc"], **kw)
        ax_loss.plot(df["round"], df["test_loss"], **kw)
    ax_acc.set(xlabel="global round", ylabel="test accuracy (%)")
    ax_loss.set(xlabel="global round", ylabel="test loss (cross-entropy)")
    ax_acc.legend(frameon=False)
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    if results:
        fig.text(0.99, 0.01, provenance_label(results[0]), ha="right", va="bottom",
                 fontsize=7, color="0.4")
    fig.tight_layout()
    return fig


def partition_plot(counts: np.ndarray, title: str | None = None, ax=None):
    """Stacked bars: samples of each class (colour) held by each client (x)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    n_clients, n_classes = counts.shape
    bottom = np.zeros(n_clients)
    pal = sns.color_palette("tab10", n_classes)
    for k in range(n_classes):
        ax.bar(np.arange(n_clients), counts[:, k], bottom=bottom, color=pal[k], label=str(k), width=0.85)
        bottom += counts[:, k]
    ax.set(xlabel="client", ylabel="training samples", xticks=np.arange(n_clients))
    ax.legend(title="class", ncol=10, fontsize=7, title_fontsize=8, frameon=False,
              loc="upper center", bbox_to_anchor=(0.5, 1.18))
    if title:
        ax.set_title(title, pad=28)
    return ax
