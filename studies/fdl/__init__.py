"""FDL (Cheng): settings and published numbers (``settings``), the configurations of its pages
(``pages``) and their verdict rules (``claims``)."""

from studies.fdl import claims, pages, settings

PAPER_NAME = "FDL"
__all__ = ["PAPER_NAME", "claims", "pages", "settings"]
