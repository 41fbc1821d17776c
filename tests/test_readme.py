"""The README is the front door (issue 66): short, and no measurement in it that can go stale
unchecked. Measurements live on the book's pages, generated from data/; the one count the README
states (results trained at paper) is checked against the committed results in test_campaign.py."""

from __future__ import annotations

import re

from fedlib.results import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _prose(text: str) -> str:
    """The README without its fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 150


def test_the_readme_states_no_dated_or_unchecked_measurement():
    prose = _prose(README)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", prose), "a dated measurement in the README"
    units = r"\d[\d,.]*\s*(%|GFLOP|TFLOP|PFLOP|GB|MB|ms\b|s\b|seconds|min\b|minutes|hours|GPU-minutes|x\b)"
    found = re.findall(r"[^.\n]*" + units + r"[^.\n]*", prose)
    assert not found, f"a measurement in the README's prose (put it on a page generated from data/): {found}"


def test_the_readme_links_exist():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (REPO_ROOT / target).exists(), target
