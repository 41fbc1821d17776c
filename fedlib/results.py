"""Results: one JSON file per run under ``data/results/``, keyed by the config hash.

Writes are atomic (a temporary file in the same folder, then ``os.replace``), so a killed
run never leaves a half-written result. Each result records its config, the history per
round and provenance (seed, device, versions, git commit, duration).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from fedlib.config import Config

REPO_ROOT = Path(__file__).resolve().parents[1]


def results_dir() -> Path:
    """``$FEDLIB_RESULTS_DIR`` or ``<repo>/data/results``."""
    return Path(os.environ.get("FEDLIB_RESULTS_DIR", REPO_ROOT / "data" / "results"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def git_commit() -> str:
    """The repository's HEAD commit, with ``-dirty`` when tracked files other than the
    build's own outputs under ``data/`` (results, verdicts, timings) differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)data"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.cache
def code_commit() -> str:
    """:func:`git_commit` as it was when this process first asked: the code a long run executes is
    what it imported at its start, so an edit or a checkout during the run must not change the
    commit its results record."""
    return git_commit()


def provenance(device: torch.device, engine: str) -> dict[str, Any]:
    import numpy

    dev = str(device)
    if device.type == "cuda":
        dev += f" ({torch.cuda.get_device_name(device)})"
    return {"device": dev, "engine": engine, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads(), "git_commit": code_commit()}


@dataclass
class Result:
    """A finished run: its config, per-round history and provenance."""

    config: Config
    history: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def final(self) -> dict[str, Any]:
        """The last evaluated round's metrics."""
        evaluated = [h for h in self.history if h.get("test_acc") is not None]
        return evaluated[-1] if evaluated else {}

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.history)

    def to_json(self) -> str:
        return json.dumps({"config": self.config.to_dict(), "history": self.history,
                           "meta": self.meta}, indent=1)

    @classmethod
    def load(cls, path: Path) -> Result:
        d = json.loads(Path(path).read_text())
        return cls(Config.from_dict(d["config"]), d["history"], d["meta"], Path(path))

    def save(self, path: Path) -> None:
        atomic_write_bytes(path, self.to_json().encode())
        self.path = path


def diverged(history: list[dict[str, Any]]) -> bool:
    """Whether a run's history holds a non-finite loss (a training loss counts only in a round with
    clients: a round without any has none to report)."""
    for h in history:
        v = h.get("test_loss")
        if v is not None and not math.isfinite(v):
            return True
        v = h.get("train_loss")
        if v is not None and h.get("clients", 1) != 0 and not math.isfinite(v):
            return True
    return False


def result_path(config: Config, root: Path | None = None) -> Path:
    return Path(root or results_dir()) / f"{config.algorithm}-{config.key()}.json"


def checkpoint_path(config: Config, root: Path | None = None) -> Path:
    return Path(root or results_dir()) / "checkpoints" / f"{config.key()}.pt"


def model_path(config: Config, root: Path | None = None) -> Path:
    return Path(root or results_dir()) / "models" / f"{config.key()}.pt"
