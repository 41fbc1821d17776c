"""MOON-DPAP (Su, ICDSE 2025): settings and published numbers (``settings``), the configurations
of its six pages (``pages``) and their verdict rules (``claims``)."""

from studies.moon_dpap import claims, pages, settings

PAPER_NAME = "MOON-DPAP"
__all__ = ["PAPER_NAME", "claims", "pages", "settings"]
