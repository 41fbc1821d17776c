"""The claims ledger: every page that tests a paper's claims records its findings, and the
book's front page collects them into one table.

``record(page, findings, profile, paper)`` writes ``<verdicts>/<page>.json`` atomically: the
findings (claim, ours, verdict class, reason) plus the page, profile, seeds, commit and time.
Verdict classes are data (:class:`studies.claims.Verdict`); nothing parses text.

Where it writes: ``data/verdicts/`` when the book is being built (``FEDLIB_INTO_BOOK=1``, which
``python -m lab.notebooks`` sets), else a scratch folder (:func:`studies.common.scratch_dir`),
so a curious rerun of one notebook never changes the book's tracked files.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd

from fedlib.results import REPO_ROOT, atomic_write_bytes, git_commit, results_dir
from studies.claims import EVIDENCE, Finding, Verdict
from studies.common import into_book, scratch_dir

COLUMNS = ["paper", "page", "claim", "ours", "verdict", "reason", "profile", "seeds", "commit"]


def book_verdicts_dir() -> Path:
    """``data/verdicts/`` beside the results store (``$FEDLIB_RESULTS_DIR/../verdicts`` when set)."""
    return results_dir().parent / "verdicts"


def verdicts_dir() -> Path:
    """Where :func:`record` writes: the book's folder during a book build, else scratch."""
    return book_verdicts_dir() if into_book() else scratch_dir() / "verdicts"


def record(
    page: str,
    findings: list[Finding],
    profile: str,
    paper: str,
    seeds: int | None = None,
    root: Path | None = None,
) -> Path:
    """Save the ``findings`` of notebook ``page``; returns the file written."""
    if not findings or not all(isinstance(f, Finding) for f in findings):
        raise ValueError("record needs a non-empty list of Finding")
    out = Path(root or verdicts_dir()) / f"{page}.json"
    payload = {
        "page": page,
        "paper": paper,
        "profile": profile,
        "seeds": seeds,
        "commit": git_commit(),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "findings": [f.row() for f in findings],
    }
    atomic_write_bytes(out, json.dumps(payload, indent=1).encode())
    return out


def table(findings: list[Finding]) -> pd.DataFrame:
    """The findings of one page as a table."""
    return pd.DataFrame([f.row() for f in findings])[["claim", "ours", "verdict", "reason"]]


def badge(verdict: Verdict | str) -> str:
    """A verdict class as an inline HTML badge (coloured by the book's stylesheet)."""
    v = Verdict(str(verdict))
    return f'<span class="verdict verdict-{v.name.lower().replace("_", "-")}">{v.value}</span>'


def _cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def show(findings: list[Finding]):
    """The findings as a Markdown table (maths renders, verdicts on their colour)."""
    from IPython.display import Markdown

    rows = [
        {"claim": f.claim, "ours": f.ours, "verdict": badge(f.verdict), "why": f.reason} for f in findings
    ]
    return Markdown(markdown_table(rows, ["claim", "ours", "verdict", "why"]))


def collect(root: Path | None = None) -> pd.DataFrame:
    """Every recorded finding, one row each, with its page's paper, profile, seeds and commit."""
    rows = []
    for path in sorted(Path(root or book_verdicts_dir()).glob("*.json")):
        d = json.loads(path.read_text())
        for f in d["findings"]:
            rows.append(
                {
                    "paper": d["paper"],
                    "page": d["page"],
                    **f,
                    "profile": d["profile"],
                    "seeds": d.get("seeds"),
                    "commit": d["commit"][:7],
                }
            )
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["verdict"] = [Verdict(v) for v in df["verdict"]]
    return df


#: Order of the profiles in the ledger: evidence at the papers' scale first.
PROFILE_ORDER = ("paper", "quick", "smoke")


def paper_scale_first(df: pd.DataFrame, papers: list[str] | None = None) -> pd.DataFrame:
    """The findings with the ``paper`` profile's rows first, then ``quick``, then ``smoke``; within a
    profile in the papers' order (``papers``), each page's claims in their recorded order."""
    papers = papers or list(dict.fromkeys(df["paper"]))
    rank = {p: i for i, p in enumerate(PROFILE_ORDER)}
    key = df.assign(_profile=df["profile"].map(lambda p: rank.get(p, len(rank))),
                    _paper=df["paper"].map(lambda p: papers.index(p) if p in papers else len(papers)),
                    _row=range(len(df)))
    return key.sort_values(["_profile", "_paper", "_row"]).drop(columns=["_profile", "_paper", "_row"])


def counts_by_profile(df: pd.DataFrame) -> pd.DataFrame:
    """Findings per paper and profile (how much of the ledger stands at the papers' scale)."""
    out = pd.crosstab(df["paper"], df["profile"])
    return out[[p for p in PROFILE_ORDER if p in out.columns]]


def counts(df: pd.DataFrame) -> pd.DataFrame:
    """Findings per paper and class; ``evidence`` counts only reproduced / partly / not reproduced."""
    out = pd.crosstab(df["paper"], df["verdict"].map(lambda v: v.value))
    out["evidence"] = sum(out.get(v.value, 0) for v in EVIDENCE)
    return out


def page_titles() -> dict[str, str]:
    """Notebook stem -> the title of its page (its first heading)."""
    out = {}
    for src in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(src.read_text())
        first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
        line = "".join(first["source"]).splitlines()[0] if first else src.stem
        out[src.stem] = line.lstrip("# ").strip()
    return out


def _setting(paper: str, profile: str):
    """A representative configuration of ``paper``'s study at ``profile`` and that profile's seeds."""
    from studies.common import scale_of
    from studies.dpfl import settings as dpfl
    from studies.fdl import settings as fdl
    from studies.moon_dpap import settings as moon_dpap

    if paper == "MOON-DPAP":
        return moon_dpap.config_for("fedavg", profile), scale_of(moon_dpap.SCALES, profile).seeds
    if paper == "FDL":
        return fdl.config_for("noldp", profile), scale_of(fdl.SCALES, profile).seeds
    if paper == "DP-FL analysis":
        return dpfl.base_config(profile), scale_of(dpfl.SCALES, profile).seeds
    raise KeyError(paper)


def reduction(paper: str, profile: str) -> str:
    """What ``profile`` keeps of ``paper``'s study at the ``paper`` profile, computed from the two
    configurations (e.g. "20 of 200 rounds, 4,000 of 60,000 training images, 3 seeds")."""
    from fedlib.data import TRAIN_SIZE

    cfg, seeds = _setting(paper, profile)
    ref, ref_seeds = _setting(paper, "paper")
    images = lambda c: c.train_samples or TRAIN_SIZE  # noqa: E731 (0 means the full split)
    parts = [f"{cfg.rounds} of {ref.rounds} rounds" if cfg.rounds != ref.rounds
             else f"all {cfg.rounds} rounds",
             f"{images(cfg):,} of {images(ref):,} training images" if images(cfg) != images(ref)
             else f"all {images(cfg):,} training images"]
    if cfg.clients != ref.clients:
        parts.append(f"{cfg.clients} of {ref.clients} clients")
    if cfg.model != ref.model:
        parts.append(f"model {cfg.model} instead of {ref.model}")
    parts.append(f"{seeds} seed{'s' if seeds != 1 else ''}" + (f" (paper profile: {ref_seeds})"
                                                                if seeds != ref_seeds else ""))
    return ", ".join(parts)


def bottom_line(df: pd.DataFrame, paper: str) -> str:
    """Three sentences on one paper, from its findings: the count per class, what did not hold, and
    what the evidence cannot decide yet."""
    rows = df[df["paper"] == paper]
    n = {v: int((rows["verdict"] == v).sum()) for v in Verdict}
    evidence = sum(n[v] for v in EVIDENCE)
    first = (
        f"Of {len(rows)} claims, {evidence} could be judged: {n[Verdict.REPRODUCED]} reproduced, "
        f"{n[Verdict.PARTLY]} partly, {n[Verdict.NOT_REPRODUCED]} not reproduced"
    )
    extra = [
        f"{n[v]} {v.value}"
        for v in (Verdict.INCONCLUSIVE, Verdict.NOT_TESTABLE, Verdict.SANITY, Verdict.NOT_EVALUATED)
        if n[v]
    ]
    first += " (" + ", ".join(extra) + ")." if extra else "."
    failed = rows[rows["verdict"] == Verdict.NOT_REPRODUCED]
    second = (
        "Not reproduced: " + "; ".join(f"{r.claim} ({r.reason})" for r in failed.head(2).itertuples()) + "."
        if len(failed)
        else "No claim was contradicted by our evidence."
    )
    open_ = rows[rows["verdict"] == Verdict.INCONCLUSIVE]
    reasons = open_["reason"].value_counts()
    third = (
        f"Open: {len(open_)} claim(s), mostly because {reasons.index[0]}."
        if len(open_)
        else "No claim is left open."
    )
    return " ".join((first, second, third))
