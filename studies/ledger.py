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

from fedlib.results import REPO_ROOT, git_commit, results_dir, write_json_unless_stamps_only
from studies.claims import EVIDENCE, Finding, Verdict, combine
from studies.common import into_book, scratch_dir

COLUMNS = ["paper", "page", "claim", "ours", "verdict", "reason", "scope", "profile", "seeds", "commit",
           "part_of", "role", "page_profile"]


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
    # a rebuild that changes no finding leaves the tracked file (and git) as it was
    write_json_unless_stamps_only(out, payload, stamps=("commit", "time"))
    return out


def table(findings: list[Finding]) -> pd.DataFrame:
    """The findings of one page as a table."""
    return pd.DataFrame([f.row() for f in findings])[["claim", "ours", "verdict", "reason"]]


def badge(verdict: Verdict | str) -> str:
    """A verdict class as an inline HTML badge (coloured by the book's stylesheet)."""
    v = Verdict(str(verdict))
    return f'<span class="verdict verdict-{v.name.lower().replace("_", "-")}">{v.value}</span>'


def _cell(text) -> str:
    from studies.numbers import symbols

    return symbols(str(text)).replace("|", "/").replace("\n", " ")


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def show(findings: list[Finding]):
    """A page's findings in the ledger's own layout (:func:`claims_table`: the verdict badge before the
    claim, the claim unbroken, what we measured and why beside it; issue 79), each row's profile and
    seeds said where the row was graded at another profile than the page's."""
    from IPython.display import Markdown

    rows = [{"verdict": f.verdict, "claim": f.claim, "ours": f.ours, "reason": f.reason, "scope": f.scope,
             "profile": f.profile, "seeds": f.seeds, "page": "", "part_of": f.part_of, "role": f.role}
            for f in findings]
    return Markdown(claims_table(pd.DataFrame(rows), {}, evidence=False))


def upgrade(findings: list[Finding], larger: list[Finding]) -> list[Finding]:
    """``findings`` with each claim that ``larger`` grades (at a larger profile, its runs complete
    there) replaced by that grading, in place: a claim settled at the papers' scale is never shown
    or counted as settled at a smaller one."""
    by_claim = {f.claim: f for f in larger}
    unknown = set(by_claim) - {f.claim for f in findings}
    if unknown:
        raise ValueError(f"graded at a larger profile but not a claim of this page: {sorted(unknown)}")
    return [by_claim.get(f.claim, f) for f in findings]


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
                    # a finding graded at a larger profile than its page's says so (Finding.profile);
                    # an analytic finding has no runs and no seeds
                    "profile": f.get("profile") or d["profile"],
                    "seeds": None if f.get("profile") == "analytic" else (f.get("seeds") or d.get("seeds")),
                    # the whole commit: a build from a modified tree says so ("-dirty")
                    "commit": d["commit"],
                    "page_profile": d["profile"],  # the profile the page itself rendered at
                }
            )
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["verdict"] = [Verdict(v) for v in df["verdict"]]
    for col in ("scope", "part_of", "role"):  # files recorded before rows had them: about the paper, alone
        df[col] = df[col].astype(object).fillna("")
    return with_parent_rows(df)


def with_parent_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with one row per paper claim that several sub-rows grade (:func:`studies.claims.part`: a
    claim graded in several federations, values of r or with controls), placed before its first
    sub-row: the claim's one verdict (:func:`studies.claims.combine`), at the papers' scale only when
    every deciding sub-row is, with the fewest seeds among them."""
    if not (df["part_of"] != "").any():
        return df
    out, done = [], set()
    for _, r in df.iterrows():
        parent = r["part_of"]
        if parent and parent not in done:
            done.add(parent)
            subs = df[df["part_of"] == parent]
            found = combine(parent, [Finding(s.claim, s.ours, s.verdict, s.reason, role=s.role)
                                     for s in subs.itertuples()])
            deciding = subs[subs["role"] != "context"]
            # the smallest scale among the deciding rows (analytic rows have none)
            ranked = [p for p in PROFILE_ORDER if p in set(deciding["profile"])]
            profile = ranked[-1] if ranked else deciding["profile"].iloc[0]
            out.append({**r.to_dict(), "claim": parent, "ours": found.ours, "verdict": found.verdict,
                        "reason": found.reason, "scope": "", "profile": profile,
                        "seeds": deciding["seeds"].min(), "part_of": "", "role": ""})
        out.append(r.to_dict())
    return pd.DataFrame(out, columns=COLUMNS)


def is_sub_row(df: pd.DataFrame) -> pd.Series:
    """Rows that grade part of a paper claim (counted once, through the claim's own row)."""
    return df["part_of"].fillna("") != "" if "part_of" in df else pd.Series(False, index=df.index)


def about_paper(df: pd.DataFrame) -> pd.Series:
    """Which rows are evidence about the paper, each claim once (not about this implementation or our
    reading, and not a sub-row of a claim: :func:`with_parent_rows`)."""
    return (df["scope"].fillna("") == "") & ~is_sub_row(df)


def apart(df: pd.DataFrame) -> pd.Series:
    """Rows about this implementation or our reading (counted apart), each once (not sub-rows)."""
    return (df["scope"].fillna("") != "") & ~is_sub_row(df)


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
    paper = df[about_paper(df)]
    out = pd.crosstab(paper["paper"], paper["verdict"].map(lambda v: v.value))
    out["evidence"] = sum(out.get(v.value, 0) for v in EVIDENCE)
    return out


#: The order in which verdicts are counted and listed: the evidence classes first, then what is
#: open; sanity checks (true by construction) are counted apart.
COUNT_ORDER = (Verdict.REPRODUCED, Verdict.PARTLY, Verdict.NOT_REPRODUCED, Verdict.INCONCLUSIVE,
               Verdict.NOT_TESTABLE, Verdict.NOT_EVALUATED)

#: What each verdict class means (the ledger's legend).
MEANING = {
    Verdict.REPRODUCED: "the claim holds in our runs",
    Verdict.PARTLY: "the direction holds but not the size, or the bound is valid but loose",
    Verdict.NOT_REPRODUCED: "our runs contradict it, including runs that fail under the paper's recipe",
    Verdict.INCONCLUSIVE: "our evidence cannot decide it yet (the row says why)",
    Verdict.NOT_TESTABLE: "the paper omits what a test needs",
    Verdict.SANITY: "true by construction; not counted",
    Verdict.NOT_EVALUATED: "smoke runs only",
}


def legend() -> str:
    """The verdict classes with their badges (the same :func:`badge` as the table) and meanings."""
    return "; ".join(f"{badge(v)} {MEANING[v]}" for v in (*COUNT_ORDER, Verdict.SANITY)) + "."


def verdict_counts(df: pd.DataFrame, papers: list[str] | None = None) -> pd.DataFrame:
    """One row per paper: its claims per verdict class in :data:`COUNT_ORDER` (a class nobody has,
    "not evaluated", left out), their total, and apart the sanity checks and the rows about this
    implementation or our reading (:class:`studies.claims.Finding`'s scope); a last row sums them."""
    papers = papers or list(dict.fromkeys(df["paper"]))
    shown = [v for v in COUNT_ORDER if v is not Verdict.NOT_EVALUATED or (df["verdict"] == v).any()]
    rows = []
    for paper in papers:
        g = df[df["paper"] == paper]
        aside = g[apart(g)]
        g = g[about_paper(g)]
        n = {v: int((g["verdict"] == v).sum()) for v in Verdict}
        rows.append({"paper": paper, **{v.value: n[v] for v in shown},
                     "total": sum(n[v] for v in shown), "sanity checks (apart)": n[Verdict.SANITY],
                     "about our code or reading (apart)": len(aside)})
    out = pd.DataFrame(rows)
    total = {"paper": "all three papers", **{c: int(out[c].sum()) for c in out.columns if c != "paper"}}
    return pd.concat([out, pd.DataFrame([total])], ignore_index=True)


def _one_line(text) -> str:
    from studies.numbers import symbols

    return " ".join(symbols(str(text)).split())


#: Words in a row's claim, scope or reason that make its verdict depend on the unit of privacy (a
#: reading of a paper's DP, client- against record-level, local DP): such rows link to the page that
#: compares the units (notebooks/units_of_privacy.ipynb, issue 77).
UNIT_WORDS = ("[reading:", "client-level", "record-level", "local dp", "-ldp", "ldp ")


def depends_on_unit(row) -> bool:
    text = " ".join(str(getattr(row, k, "") or "") for k in ("claim", "scope", "reason")).lower()
    return any(w in text for w in UNIT_WORDS)


def claims_table(df: pd.DataFrame, titles: dict[str, str], evidence: bool = True) -> str:
    """One paper's findings as a two-column MyST table that fits the page: the verdict badge right
    before the claim (with the page holding its evidence, the profile and seeds below it), and what
    our code measured with the reason for the verdict. ``evidence`` False: a page's own table (no link
    to itself; a row's profile said only where it has one of its own)."""
    lines = [":::{list-table}", ":header-rows: 1", ":widths: 45 55", ":class: ledger-claims", "",
             "* - verdict and claim", "  - what we measured, and why"]
    for r in df.itertuples():
        seeds = "" if pd.isna(r.seeds) else f", {int(r.seeds)} seed{'s' if int(r.seeds) != 1 else ''}"
        scope = getattr(r, "scope", "") or ""
        part_of = getattr(r, "part_of", "") or ""
        lead = "↳ " if part_of else ""
        lines += [f"* - {lead}{badge(r.verdict)} {_one_line(r.claim)}", ""]
        if part_of:
            role = {"context": "shown beside the claim, not deciding it"}.get(getattr(r, "role", ""),
                                                                              "one of its settings")
            lines += [f"    <small>**part of the claim above** ({role}): counted once, there</small>", ""]
        if scope:
            lines += [f"    <small>**not counted as evidence about the paper**: {_one_line(scope)}</small>",
                      ""]
        if evidence:
            whose = (" · whose privacy: [the units compared](units_of_privacy.ipynb)"
                     if depends_on_unit(r) else "")
            lines += [f"    <small>evidence: [{_one_line(titles.get(r.page, r.page))}]({r.page}.ipynb) "
                      f"({r.profile}{seeds}){whose}</small>", ""]
        elif r.profile:
            lines += [f"    <small>graded at `{r.profile}`{seeds}</small>", ""]
        lines += [f"  - {_one_line(r.ours)}"]
        if r.reason:
            lines += ["", f"    <small>why: {_one_line(r.reason)}</small>"]
    return "\n".join([*lines, ":::"])


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
        from studies.common import MODEL_LABELS

        label = lambda m: MODEL_LABELS.get(m, m)  # noqa: E731
        parts.append(f"{label(cfg.model)} instead of {label(ref.model)}")
    parts.append(f"{seeds} seed{'s' if seeds != 1 else ''}" + (f" (paper profile: {ref_seeds})"
                                                                if seeds != ref_seeds else ""))
    return ", ".join(parts)


def bottom_line(df: pd.DataFrame, paper: str) -> str:
    """Three short lines on one paper, from its findings: what could be judged and how, which claims
    did not hold, and what is still open (and at which profile)."""
    rows = df[df["paper"] == paper]
    aside = int(apart(rows).sum())
    rows = rows[about_paper(rows)]
    n = {v: int((rows["verdict"] == v).sum()) for v in Verdict}
    counted = len(rows) - n[Verdict.SANITY]
    evidence = sum(n[v] for v in EVIDENCE)
    untestable = n[Verdict.NOT_TESTABLE]
    judged = (f"**Judged** {evidence} of {counted} claims: {n[Verdict.REPRODUCED]} reproduced, "
              f"{n[Verdict.PARTLY]} partly, {n[Verdict.NOT_REPRODUCED]} not reproduced"
              + (f"; {untestable} not testable as the paper states them" if untestable else "")
              + (f"; {aside} more about our code or reading, counted apart" if aside else "") + ".")
    failed = rows[rows["verdict"] == Verdict.NOT_REPRODUCED]
    contradicted = ("**Not reproduced**: " + "; ".join(_one_line(c) for c in failed["claim"]) + "."
                    if len(failed) else "**Not reproduced**: none of its claims.")
    open_ = rows[rows["verdict"] == Verdict.INCONCLUSIVE]
    if len(open_):
        by_profile = open_["profile"].value_counts()
        where = ", ".join(f"{k} at `{p}`" for p, k in by_profile.items())
        waiting = int(by_profile.drop("paper", errors="ignore").sum())
        still = (f"**Open**: {len(open_)} inconclusive ({where})"
                 + (f"; {waiting} of them wait for the `paper` profile" if waiting else "") + ".")
    else:
        still = "**Open**: nothing."
    return "  \n".join((judged, contradicted, still))
