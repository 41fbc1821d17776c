"""The claims ledger: every page that tests a paper's claim records its verdicts here, and
the book's front page collects them into one table.

``record(page, verdicts, profile, paper)`` writes ``data/verdicts/<page>.json`` atomically:
the rows (claim, ours, verdict) plus the page, profile, commit and time. ``collect()`` reads
them all back as one DataFrame, with each verdict mapped onto four classes by
:func:`classify`.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd

from fedlib.results import atomic_write_bytes, git_commit, results_dir

CLASSES = ("reproduced", "partly", "not reproduced", "not testable as specified")


def verdicts_dir() -> Path:
    return results_dir().parent / "verdicts"


def classify(verdict: str) -> str:
    """Map a page's free-text verdict onto the ledger's four classes."""
    v = verdict.lower()
    if v.startswith(("not comparable", "not testable", "not reproducible")):
        return "not testable as specified"
    if v.startswith("not reproduced"):
        return "not reproduced"
    if v.startswith("reproduced") and "peak not reproduced" not in v:
        return "reproduced"
    return "partly"  # "partly ...", and statements that are valid or correct but loose


def record(page: str, verdicts: pd.DataFrame, profile: str, paper: str, root: Path | None = None) -> Path:
    """Save ``verdicts`` (columns claim, ours, verdict) of notebook ``page``."""
    missing = {"claim", "ours", "verdict"} - set(verdicts.columns)
    if missing:
        raise ValueError(f"verdicts need columns claim, ours, verdict; missing {sorted(missing)}")
    out = Path(root or verdicts_dir()) / f"{page}.json"
    payload = {"page": page, "paper": paper, "profile": profile, "commit": git_commit(),
               "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
               "rows": verdicts[["claim", "ours", "verdict"]].astype(str).to_dict("records")}
    atomic_write_bytes(out, json.dumps(payload, indent=1).encode())
    return out


def collect(root: Path | None = None) -> pd.DataFrame:
    rows = []
    for path in sorted(Path(root or verdicts_dir()).glob("*.json")):
        d = json.loads(path.read_text())
        for r in d["rows"]:
            rows.append({"paper": d["paper"], "page": d["page"], **r, "class": classify(r["verdict"]),
                         "profile": d["profile"], "commit": d["commit"][:7]})
    columns = ["paper", "page", "claim", "ours", "verdict", "class", "profile", "commit"]
    return pd.DataFrame(rows, columns=columns)
