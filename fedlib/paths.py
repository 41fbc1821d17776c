"""Where fedlib keeps things: the study's checkout or a home of its own, and the environment settings
that choose folders. A module of its own so that the data, results and run modules share it without
importing one another."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Whether fedlib runs from the study's checkout (its results, data and commit are the repository's), or
#: installed on its own (``pip install .``: results under the working folder, data in the user's cache).
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "studies").is_dir()


def user_cache() -> Path:
    """``$XDG_CACHE_HOME/fedlib`` (``~/.cache/fedlib``): checkpoints, and the data of an installed fedlib."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedlib"


def folder_setting(name: str) -> Path | None:
    """The folder an environment setting names, or None when it is not set. Set but empty (or blank),
    it is refused with one line naming it: ``Path("")`` is the current folder, where a run would
    otherwise write its results, models, locks and checkpoints without a word (issue 78)."""
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip():
        raise ValueError(f"{name} is set but empty: set it to a folder, or unset it for the default")
    return Path(value)
