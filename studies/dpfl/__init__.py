"""The DP-FL analysis (Dutra): our federation and the article's claims (``settings``), the
configurations and analyses of its pages (``pages``) and their verdict rules (``claims``)."""

from studies.dpfl import claims, pages, settings

PAPER_NAME = "DP-FL analysis"
__all__ = ["PAPER_NAME", "claims", "pages", "settings"]
