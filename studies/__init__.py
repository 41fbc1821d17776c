"""The three papers this project reproduces, each a package with its settings, published numbers,
the configurations its pages run (``pages.PAGES``) and its verdict rules (``claims``):

* :mod:`studies.moon_dpap` - MOON-DPAP (Su, ICDSE 2025);
* :mod:`studies.fdl` - FDL, federated learning by dimension selection (Cheng);
* :mod:`studies.dpfl` - the DP-FL analysis (Dutra).

Shared: :mod:`studies.common` (profiles, seeds, runs), :mod:`studies.claims` (verdict classes and
statistical rules), :mod:`studies.ledger` (the claims ledger). The library they use is ``fedlib``,
which imports nothing from here.
"""

from __future__ import annotations

from fedlib.config import Config
from studies.common import PROFILES

STUDIES = ("moon_dpap", "fdl", "dpfl")


def pages() -> dict:
    """Every page that trains, across the studies: notebook stem -> configs function."""
    from studies.dpfl.pages import PAGES as DPFL
    from studies.fdl.pages import PAGES as FDL
    from studies.moon_dpap.pages import PAGES as MOON_DPAP

    return {**MOON_DPAP, **FDL, **DPFL}


def configs(profile: str, n_seeds: int | None = None) -> dict[str, list[Config]]:
    """Every configuration the book's pages need at ``profile`` (with ``n_seeds`` seeds instead of
    the profile's own number when given), per page (duplicates removed within a page; pages share
    some)."""
    out = {}
    for page, fn in pages().items():
        seen, cs = set(), []
        for group in fn(profile, n_seeds).values():
            for c in group:
                if c.key() not in seen:
                    seen.add(c.key())
                    cs.append(c)
        out[page] = cs
    return out


#: The paper each study's pages record their findings under (the ledger's ``paper`` column).
PAPER_NAMES = {"moon_dpap": "MOON-DPAP", "fdl": "FDL", "dpfl": "DP-FL analysis"}


def page_study(page: str) -> str:
    """The study a page (notebook stem) belongs to."""
    return next(s for s in STUDIES if page.startswith(s + "_"))


def claim_needs() -> dict:
    """Every page whose runs decide ledger claims: notebook stem -> (ConfigSet -> list of Needs)."""
    from studies.dpfl.pages import CLAIMS as DPFL
    from studies.fdl.pages import CLAIMS as FDL
    from studies.moon_dpap.pages import CLAIMS as MOON_DPAP

    return {**MOON_DPAP, **FDL, **DPFL}


def claim_runs(profile: str, n_seeds: int | None = None) -> list[tuple[str, str, object, list[Config]]]:
    """Every claim that training settles at ``profile``: (paper, page, :class:`~studies.common.Needs`,
    the configs of every seed of the labels that decide it)."""
    out = []
    needs, fns = claim_needs(), pages()
    for page, fn in needs.items():
        cs = fns[page](profile, n_seeds)
        for n in fn(cs):
            labels = (*n.labels, *n.optional)
            unknown = [label for label in labels if label not in cs]
            if unknown:
                raise KeyError(f"{page}: claim {n.claim!r} names runs the page does not have: {unknown}")
            out.append((PAPER_NAMES[page_study(page)], page, n, [c for label in labels for c in cs[label]]))
    return out


__all__ = ["PAPER_NAMES", "PROFILES", "STUDIES", "claim_needs", "claim_runs", "configs", "page_study",
           "pages"]
