"""Claims settled at a larger profile than their page's: the campaign trains claims first, so a claim's
runs can be complete at the papers' scale long before its page's are. A page rendered at ``quick``
finds them (:func:`settled_beyond`), shows them (:func:`show_settled_beyond`) and grades those claims
on them with its study's ``*_settled`` rules, so that the ledger counts them at ``paper`` (issue 39)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.results import load_cached
from studies import claim_needs, pages
from studies.common import PROFILES, Runs, read_roots, table_for_reader, write_root
from studies.numbers import number


def settled_beyond(page: str, profile: str, larger: str = "paper", **params) -> tuple[Runs, list[str]]:
    """While ``page`` renders at ``profile``: the claims of the page whose runs are all committed at
    the ``larger`` profile (its default seeds; nothing is trained), and their runs at that profile
    (only the labels those claims need); a claim some of whose runs can refute it (``Needs.refutable``)
    comes with the runs complete there once two of its labels are, for the page to grade on them. A
    page already at ``larger`` gets nothing: its own findings stand there. The campaign trains claims
    first, so a claim can be settled at the papers' scale long before its page is. ``params``: the
    page's own parameters (its configs depend on them)."""
    if PROFILES.index(profile) >= PROFILES.index(larger) or page not in claim_needs():
        return Runs({}), []
    configs = pages()[page](larger, None, **params)
    roots = [*read_roots(), write_root()]
    found = {label: [load_cached(c, roots) for c in cs] for label, cs in configs.items()}
    complete = {label for label, rs in found.items() if all(r is not None for r in rs)}
    needs = claim_needs()[page](configs)
    settled = [n for n in needs if set(n.labels) <= complete]
    # a claim that some of its runs can refute: graded on what is complete when two labels are
    # (the page's rule keeps it only when those runs refute it)
    settled += [n for n in needs if n.refutable and n not in settled
                and len(complete & set(n.labels)) >= 2 and n.labels[0] in complete]
    labels = dict.fromkeys(label for n in settled for label in (*n.labels, *n.optional) if label in complete)
    return Runs({label: found[label] for label in labels}), [n.claim for n in settled]


def reader_label(label) -> str:
    """A run label as a reader reads it: a method's name (``moon_dpap`` -> MOON-DPAP), a method in a
    federation (``moon_dpap|0.1`` -> "MOON-DPAP, Dirichlet alpha = 0.1"), a tuple's parts each as
    :func:`studies.numbers.number` writes it (an infinite budget as ∞)."""
    from studies.claims import METHOD_NAMES

    if isinstance(label, tuple) and len(label) == 3 and label[0] == "paper grid":
        return f"paper grid: lr {label[1]:g}, C = {label[2]:g} (its validation split, its first rounds)"
    if isinstance(label, str) and " (" in label and label.split(" (", 1)[0] in METHOD_NAMES:
        method, rest = label.split(" (", 1)
        return f"{METHOD_NAMES[method]} ({rest}"
    if isinstance(label, tuple):
        return ", ".join(METHOD_NAMES.get(p, number(p)) if isinstance(p, str) else number(p) for p in label)
    if isinstance(label, str) and "|" in label:
        method, value = label.split("|", 1)
        return f"{METHOD_NAMES.get(method, method)}, Dirichlet alpha = {value}"
    return METHOD_NAMES.get(label, number(label)) if isinstance(label, str) else number(label)


def larger_profile_rows(runs: Runs, label_name: str = "runs") -> pd.DataFrame:
    """One row per label of runs graded at a larger profile than their page's: its profile, seeds and
    device, and the final test accuracy (mean over the seeds and its 95 % t-interval), for a page to
    show (the profile's setting is the page's header's at ``paper``; few columns, so that none is
    squeezed below its words)."""
    from studies.claims import mean_ci, seeds_at_chance

    rows = []
    for label, rs in runs.results.items():
        c = rs[0].config
        acc = np.array([100 * r.final["test_acc"] for r in rs])
        devices = sorted({str(r.meta.get("device", "?")).split(" ")[0] for r in rs})
        _, lo, hi = mean_ci(acc)
        split = seeds_at_chance(acc, 10.0)  # an interval over seeds that collapsed and seeds that learned
        interval = ("seeds split: " + ", ".join(f"{a:.1f}" for a in acc)) if split else (
            f"[{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) else "one seed")
        rows.append({label_name: reader_label(label), "profile": c.profile, "seeds": len(rs),
                     "final accuracy (%)": float(acc.mean()),
                     "95 % interval": interval,
                     "device": ", ".join(devices)})
    return pd.DataFrame(rows)


def show_paper_first(page: str, profile: str, label_name: str = "runs", **params) -> tuple[Runs, list[str]]:
    """The top of a page rendered below the papers' scale (issue 79): the runs complete at ``paper``
    that already decide some of its claims (:func:`settled_beyond`), as a table with their intervals,
    labelled with their profile, and which claims they decide; what follows on the page is the
    ``profile`` preview. Nothing when no claim of the page is settled at ``paper`` (or the page renders
    there). Returns the runs and the claims, for the page's verdicts."""
    from IPython.display import Markdown, display

    from studies.numbers import code_names

    runs, settled = settled_beyond(page, profile, **params)
    if settled:
        claims = "; ".join(code_names(c, markdown=True) for c in settled)
        display(Markdown(f"**At the papers' scale.** These runs are complete at the `paper` profile (the "
                         f"papers' data, rounds and seeds) and decide this page's verdicts on: {claims}. "
                         f"Everything below them is the `{profile}` profile's preview (reduced data and "
                         "rounds), which decides only what the `paper` runs do not yet."))
        display(table_for_reader(larger_profile_rows(runs, label_name)))
    return runs, settled


def show_settled_beyond(page: str, profile: str, label_name: str = "runs",
                        **params) -> tuple[Runs, list[str]]:
    """:func:`settled_beyond`, and on the page (when it finds any) the runs at the papers' scale that
    settle some of its claims already, labelled with their profile and seeds, and which claims they
    settle; the page then grades those claims on them (each study's ``*_settled`` rules)."""
    from IPython.display import Markdown, display

    runs, settled = settled_beyond(page, profile, **params)
    if settled:
        from studies.numbers import code_names

        claims = "; ".join(code_names(c, markdown=True) for c in settled)
        display(Markdown(f"**At the papers' scale already.** The campaign trains claims first: the runs "
                         f"below are complete at the `paper` profile while this page renders at `{profile}`, "
                         f"so the claims they decide are graded on them, not on this page's runs: {claims}."))
        display(table_for_reader(larger_profile_rows(runs, label_name)))
    return runs, settled
