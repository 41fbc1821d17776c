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


def configs(profile: str) -> dict[str, list[Config]]:
    """Every configuration the book's pages need at ``profile``, per page (duplicates removed
    within a page; pages share some)."""
    out = {}
    for page, fn in pages().items():
        seen, cs = set(), []
        for group in fn(profile).values():
            for c in group:
                if c.key() not in seen:
                    seen.add(c.key())
                    cs.append(c)
        out[page] = cs
    return out


__all__ = ["PROFILES", "STUDIES", "configs", "pages"]
