"""Results: one JSON file per run under ``data/results/``, keyed by the config hash.

Writes are atomic (a temporary file in the same folder, then ``os.replace``), so a killed
run never leaves a half-written result. Each result records its config, the history per
round and provenance (seed, device, versions, git commit, duration).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedlib.config import Config
from fedlib.kernels import device_options, kernel_settings
from fedlib.paths import IN_CHECKOUT, REPO_ROOT, folder_setting, user_cache  # noqa: F401 (re-exported)


def results_dir() -> Path:
    """``$FEDLIB_RESULTS_DIR``, else ``<repo>/data/results`` in the study's checkout, else
    ``./fedlib-results`` (fedlib installed on its own: beside the work that uses it)."""
    default = REPO_ROOT / "data" / "results" if IN_CHECKOUT else Path.cwd() / "fedlib-results"
    return folder_setting("FEDLIB_RESULTS_DIR") or default


def process_umask() -> int:
    """The process's file-creation mask, read without changing it (``/proc/self/status`` on Linux;
    elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` written to ``path`` through a temporary file in the same folder, synced, then renamed:
    a reader sees the old file or the new one, never part of one. The file gets the permissions any
    file created by this process gets (0666 less its umask), not the temporary file's 0600."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~process_umask())
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"could not write {path}: {e.strerror or e}; the previous file, if any, is "
                               f"unchanged (free some space, fix the permissions or choose another folder: "
                               f"{setting_of(path.parent)})") from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_json_unless_stamps_only(path: Path, payload: dict, stamps: tuple[str, ...],
                                  compare: dict[str, Callable[[Any], Any]] | None = None) -> bool:
    """Write ``payload`` as JSON to ``path`` (atomically) unless the file there already holds the
    same payload apart from the top-level ``stamps`` (keys that only say when, where or at which
    commit it was written, such as a build's commit and time): then the file, and the repository
    holding it, stay as they are. One exception: a file stamped at a ``commit`` with uncommitted
    changes ("-dirty") is rewritten by a build at a clean commit, so that what it holds names a
    commit a reader can check out and rebuild it from. ``compare``: top-level key -> what of its value
    counts (for example the keys of a dict of timings, whose values are measurement noise). Returns
    whether it wrote."""
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = None
        new = json.loads(json.dumps(payload))  # as it would read back (tuples as lists)
        cleaned = ("commit" in stamps and isinstance(old, dict)
                   and str(old.get("commit", "")).endswith("-dirty")
                   and not str(new.get("commit", "")).endswith("-dirty"))

        def kept(d: dict) -> dict:
            return {k: (compare[k](v) if compare and k in compare else v)
                    for k, v in d.items() if k not in stamps}

        if isinstance(old, dict) and not cleaned and kept(old) == kept(new):
            return False
    atomic_write_bytes(path, json.dumps(payload, indent=1).encode())
    return True


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` into memory, then :func:`atomic_write_bytes`: a failed write (a full disk) leaves
    the previous file as it was, and says so as an ``OSError`` naming the file. Saved from a buffer,
    the archive records no file name, so the same object gives the same bytes (identical runs,
    identical model files)."""
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


#: A few MiB any write needs: a result file, a lock, a checkpoint of a small model.
MIN_FREE_BYTES = 4 * 2**20


def setting_of(folder: Path) -> str:
    """The setting that chooses ``folder``: ``FEDLIB_CHECKPOINT_DIR`` for the checkpoints' folder of
    the repository's results, else ``FEDLIB_RESULTS_DIR`` (results, models, locks, audits)."""
    try:
        chosen = os.environ.get("FEDLIB_CHECKPOINT_DIR")
        if Path(folder).resolve() in {Path(p).resolve() for p in (chosen, default_checkpoint_dir()) if p}:
            return "FEDLIB_CHECKPOINT_DIR"
    except OSError:
        pass
    return "FEDLIB_RESULTS_DIR"


def check_writable(folders: list[Path], need_bytes: int = MIN_FREE_BYTES) -> None:
    """Before any work (before any lock file too): each folder exists or can be made (a path that is a
    file is refused), a file can be written in it, and its disk has ``need_bytes`` free; else an
    ``OSError`` of one line that names the folder and the setting that chooses it."""
    for folder in folders:
        folder = Path(folder)
        setting = setting_of(folder)
        if folder.exists() and not folder.is_dir():
            raise OSError(f"{folder} is a file, not a folder; choose another folder ({setting})")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise OSError(f"cannot write to {folder}: {e.strerror or e}; choose another folder "
                          f"({setting}) or fix its permissions") from None
        free = shutil.disk_usage(folder).free
        if free < need_bytes:
            raise OSError(f"{folder} has {free / 2**20:.0f} MiB free, about {need_bytes / 2**20:.0f} MiB "
                          f"are needed; free some space or choose another folder ({setting})")


def git_commit() -> str:
    """The repository's HEAD commit, with ``-dirty`` when tracked files other than the
    build's own outputs under ``data/`` (results, verdicts, timings) differ from it; for fedlib
    installed on its own, ``fedlib <version>``."""
    if not IN_CHECKOUT:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"fedlib {version('fedlib')}"
        except PackageNotFoundError:
            return "unknown"
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


@functools.cache
def cpu_model(cpuinfo: str | None = None) -> str:
    """The host's processor as Linux reports it (``/proc/cpuinfo``: model name, family, model,
    stepping), e.g. ``AMD EPYC (family 25, model 17, stepping 1)``; ``platform.processor()``
    elsewhere. A virtual machine's model name can be as vague as "AMD EPYC": the family and model
    tell its generations apart, and they differ in both speed (a benchmark's matmul peak) and
    which vector kernels round a float32 sum."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or platform.machine()
    first = cpuinfo.split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name") or platform.processor() or platform.machine()
    ids = [f"{label} {fields[k]}" for k, label in (("cpu family", "family"), ("model", "model"),
                                                    ("stepping", "stepping")) if k in fields]
    return f"{name} ({', '.join(ids)})" if ids else name


def provenance(device: torch.device, engine: str) -> dict[str, Any]:
    """What a result records of where it was computed: device, engine path, versions, platform,
    processor, threads, the code's commit, and the kernel settings that change arithmetic."""
    import numpy

    dev = str(device)
    if device.type == "cuda":
        dev += f" ({torch.cuda.get_device_name(device)})"
    return {"device": dev, "engine": engine, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cpu": cpu_model(), "cpu_threads": torch.get_num_threads(), "git_commit": code_commit(),
            **({"kernels": kernel_settings()} if device.type == "cuda" else
               {"kernels": device_options()} if device_options() else {})}


def run_seconds(meta: dict[str, Any]) -> float:
    """Seconds of training one result accounts for: its ``meta.duration_s`` shared out among the runs
    of its run batch (each run of a batch records the whole batch's wall-clock time). A batch resumed
    from checkpoints adds the earlier rounds as each run's own share, so for it this undercounts
    those rounds by the batch size (the campaign resumes batches of one run on machines it keeps)."""
    return float(meta.get("duration_s") or 0.0) / max(1, len(meta.get("run_batch") or ()))


# ---- valid JSON: non-finite numbers as null, with what each was (issue 65) ---------------------------
def encode_nonfinite(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` (a result's config, history and meta) as valid JSON: every non-finite float of its history
    and meta becomes ``null``, and ``d["nonfinite"]`` records what each was (``{"history/12/train_loss":
    "nan"}``); nothing when there is none. A diverged run's NaN losses and FDL as published's infinite
    epsilon are such values."""
    found: dict[str, str] = {}

    def walk(x, path):
        if isinstance(x, dict):
            return {k: walk(v, f"{path}/{k}") for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, float) and not math.isfinite(x):
            found[path] = "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
            return None
        return x

    out = {k: (walk(v, k) if k in ("history", "meta") else v) for k, v in d.items() if k != "nonfinite"}
    if found:
        out["nonfinite"] = found
    return out


def decode_nonfinite(d: dict[str, Any]) -> dict[str, Any]:
    """The values :func:`encode_nonfinite` wrote as ``null``, back in place (``d`` is changed)."""
    for path, what in (d.get("nonfinite") or {}).items():
        *parents, last = path.split("/")
        node = d
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = float(what)
        else:
            node[last] = float(what)
    return d


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

    def frame(self):
        """The history as a pandas DataFrame (pandas imported here: not every process needs it)."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def to_json(self) -> str:
        """The result file's text, valid JSON (:func:`encode_nonfinite`), with the content hash of
        what it holds (``meta.content_sha256``)."""
        meta = {k: v for k, v in self.meta.items() if k != "content_sha256"}
        d = encode_nonfinite({"config": self.config.to_dict(), "history": self.history, "meta": meta})
        d["meta"]["content_sha256"] = content_hash(d)
        return json.dumps(d, indent=1, allow_nan=False)

    @classmethod
    def load(cls, path: Path, expect: Config | None = None) -> Result:
        """The result at ``path``, verified by :func:`verify_result` (the same rules ``lab.campaign
        unpack`` applies to an incoming archive): anything else is an :class:`InvalidResultFile` with a
        one-line reason. The hash catches accidental damage (a truncated or altered file, an edit
        that forgot it); it cannot catch a deliberate edit that recomputes it: ``python -m
        lab.reproduce`` retrains committed results and says which still come back."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InvalidResultFile(path, f"not a readable file ({type(e).__name__})") from None
        try:
            config, history, meta = verify_result(data, path.name, expect)
        except ResultRefused as e:
            raise InvalidResultFile(path, str(e)) from None
        return cls(config, history, meta, path)

    def save(self, path: Path) -> None:
        """Write the result atomically, with its content hash (:meth:`to_json`)."""
        text = self.to_json()
        self.meta["content_sha256"] = json.loads(text)["meta"]["content_sha256"]
        atomic_write_bytes(path, text.encode())
        self.path = path


class ResultRefused(ValueError):
    """Why a result's content does not verify (:func:`verify_result`), in one line."""


#: Metrics bounded to [0, 1] wherever a round records them.
UNIT_METRICS = ("test_acc", "personal_acc", "sent_frac", "kept_frac", "sparsity", "dead_units")
#: Metrics that are counts, sizes, norms, rates or times: >= 0.
NONNEGATIVE = ("clients", "bytes_up", "bytes_down", "wall_s", "eval_s", "clip", "next_clip",
               "update_norm_median", "update_norm_q10", "update_norm_q90", "noise_norm", "noise_multiplier",
               "lr", "weight_norm", "predicted_classes")
#: What every result's ``meta`` records of where it came from.
PROVENANCE = ("device", "git_commit", "torch", "seed", "duration_s", "config_key", "content_sha256")


def is_number(v: Any) -> bool:
    """Whether ``v`` is an int or a float (a bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def verify_result(data: bytes, name: str, expect: Config | None = None) -> tuple[Config, list, dict]:
    """A result file's bytes checked like input, the one validation of the results cache
    (:meth:`Result.load`, hence :func:`load_cached` and :func:`result_status`) and of ``lab.campaign
    unpack`` (issue 78): a JSON object with config, history and meta; a valid config whose key names
    the file (``name``) and ``meta.config_key`` (and that is ``expect`` when given); its provenance
    present; its content hash matching; its record of non-finite values well formed; every round it
    trains recorded in order, as a mapping of metric names to numbers (or null where not evaluated)
    within their ranges (an accuracy in [0, 1]; a non-finite loss only in a run marked ``diverged``,
    or a training loss in a round without clients); the last round evaluated. Returns the config, the
    history and the meta (non-finite values restored); raises :class:`ResultRefused` (one line)."""
    try:
        d = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultRefused(f"not JSON ({type(e).__name__})") from None
    if not (isinstance(d, dict) and isinstance(d.get("config"), dict) and isinstance(d.get("history"), list)
            and isinstance(d.get("meta"), dict)):
        raise ResultRefused("not a result (an object with config, history and meta)")
    try:
        config = Config.from_dict(d["config"]).validate()
    except (ValueError, TypeError) as e:
        text = " ".join(str(e).split()).removeprefix("invalid config: ")
        raise ResultRefused(f"its config is invalid ({text})") from None
    key, meta = config.key(), d["meta"]
    if name != f"{config.algorithm}-{key}.json" or meta.get("config_key") != key:
        raise ResultRefused(f"it holds the result of another config ({config.algorithm}-{key})")
    if expect is not None and config != expect:
        raise ResultRefused("its config is not the one asked for")
    missing = [k for k in PROVENANCE if k not in meta]
    if missing:
        raise ResultRefused(f"its provenance lacks {', '.join(map(repr, missing))}")
    if meta.get("content_sha256") != content_hash(d):
        raise ResultRefused("its content hash does not match (edited by hand, or written by older code: "
                            "python -m lab.migrate adds it)")
    nonfinite = d.get("nonfinite") or {}
    if not isinstance(nonfinite, dict) or not all(v in ("nan", "inf", "-inf") for v in nonfinite.values()):
        raise ResultRefused("its record of non-finite values is malformed")
    try:
        d = decode_nonfinite(d)
    except (KeyError, IndexError, ValueError, TypeError):
        raise ResultRefused("its record of non-finite values names no value it holds") from None
    history = d["history"]
    _check_history(history, config, bool(meta.get("diverged", False)))
    return config, history, d["meta"]


def _check_history(history: list, config: Config, diverged: bool) -> None:
    """The rounds of a result, checked as :func:`verify_result` says."""
    if len(history) != config.rounds_run:
        raise ResultRefused(f"{len(history)} rounds recorded, the config trains {config.rounds_run}")
    for i, h in enumerate(history):
        if not isinstance(h, dict) or h.get("round") != i + 1:
            raise ResultRefused(f"round {i + 1} is missing or out of order")
        for k, v in h.items():
            if v is None:
                continue
            if not is_number(v):
                raise ResultRefused(f"{k} = {v!r} in round {i + 1} is not a number")
            where = f"{k} = {v} in round {i + 1}"
            if k in UNIT_METRICS and not 0 <= v <= 1:
                raise ResultRefused(f"{where} is outside [0, 1]")
            if k in NONNEGATIVE and not v >= 0:
                raise ResultRefused(f"{where} is negative or not a number")
            if k.startswith("epsilon") and not v >= 0:  # inf is a valid epsilon (no guarantee)
                raise ResultRefused(f"{where} is not an epsilon")
            if k in ("test_loss", "train_loss") and not math.isfinite(v):
                no_clients = k == "train_loss" and h.get("clients") == 0
                if not (diverged or no_clients):
                    raise ResultRefused(f"{where} is not finite and the run is not marked diverged")
            elif k in ("test_loss", "train_loss") and v < 0:
                raise ResultRefused(f"{where} is negative")
    if not history or history[-1].get("test_acc") is None:
        raise ResultRefused("the last round has no test accuracy")


class InvalidResultFile(ValueError):
    """A result file that does not verify (see :meth:`Result.load`)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


def content_hash(d: dict[str, Any]) -> str:
    """SHA-256 of a result's config, history and meta (less the hash itself), as canonical JSON:
    what :meth:`Result.load` checks."""
    meta = {k: v for k, v in d["meta"].items() if k != "content_sha256"}
    body = {"config": d["config"], "history": d["history"], "meta": meta}
    if d.get("nonfinite"):  # valid JSON: what each null of history and meta was (encode_nonfinite)
        body["nonfinite"] = d["nonfinite"]
    payload = json.dumps(body, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def set_aside(path: Path, reason: str) -> Path | None:
    """Move a result file that does not verify out of the way (never delete it) to
    ``<its folder>/rejected/<name>.<UTC time>[.<n>]``, with a one-line warning on stderr; returns
    where. Names never collide: a second file set aside within the same second gets ``.1``, ``.2``...
    When another process sets the same file aside first, the name claimed here is given back and
    None is returned, silently (that process has said it)."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = path.parent / "rejected"
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        target = folder / (f"{path.name}.{stamp}" + (f".{n}" if n else ""))
        try:  # claim the name atomically (another process may be setting a file aside too)
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        break
    try:
        os.replace(path, target)
    except FileNotFoundError:  # another process moved it first: no empty placeholder left behind
        target.unlink(missing_ok=True)
        return None
    print(f"warning: {path.name} set aside to {target} ({reason}); it will be recomputed", file=sys.stderr)
    return target


class ConfigLocks:
    """One lock file per configuration under ``<root>/locks/`` (``fcntl.flock``), held while a
    process trains it, so that concurrent processes (two campaign slices, a notebook beside a
    campaign) split the work instead of training the same run twice. The kernel releases a lock
    when its process dies, however it dies, so a dead process's lock is simply taken over."""

    def __init__(self, root: Path):
        self.folder = Path(root) / "locks"
        self.held: dict[str, int] = {}

    def acquire(self, config: Config, block: bool) -> bool:
        """Lock ``config``; with ``block`` wait for another holder, else return False at once."""
        import fcntl

        key = config.key()
        if key in self.held:
            return True
        self.folder.mkdir(parents=True, exist_ok=True)
        # 0666 less the umask, as every file this process creates (atomic_write_bytes)
        fd = os.open(self.folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a curious reader
        self.held[key] = fd
        return True

    def release_all(self) -> None:
        """Release every lock this object holds."""
        import fcntl

        for fd in self.held.values():
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self.held.clear()


def load_cached(config: Config, roots: list[Path]) -> Result | None:
    """The first result of ``config`` under ``roots`` that verifies (:meth:`Result.load`); a file
    that does not is set aside (:func:`set_aside`) and the next root is tried; None if none."""
    for root in roots:
        path = result_path(config, root)
        if not path.exists():
            continue
        try:
            return Result.load(path, expect=config)
        except InvalidResultFile as e:
            set_aside(path, e.reason)
    return None


def result_status(config: Config, root: Path | None = None) -> str:
    """``present`` (a result that verifies), ``missing``, or ``invalid: <reason>`` (left in place)."""
    path = result_path(config, root)
    if not path.exists():
        return "missing"
    try:
        Result.load(path, expect=config)
        return "present"
    except InvalidResultFile as e:
        return f"invalid: {e.reason}"


#: A test loss this many times that of an untrained model (``ln K`` nats for K classes, the loss of a
#: uniform prediction) means the model is destroyed: it gives the true label a probability below
#: ``K^-1000`` on average (``e^-2303`` for ten classes).
EXPLODED_FACTOR = 1000.0


def exploded(history: list[dict[str, Any]], classes: int = 10) -> bool:
    """Whether a run's test loss ever exceeded :data:`EXPLODED_FACTOR` times the loss an untrained
    model starts from (``ln classes``): the loss exploded even if it stayed finite."""
    limit = EXPLODED_FACTOR * math.log(classes)
    return any(h.get("test_loss") is not None and math.isfinite(h["test_loss"]) and h["test_loss"] > limit
               for h in history)


def collapse(history: list[dict[str, Any]]) -> dict[str, int | None]:
    """Whether a run collapsed to a constant predictor, from its evaluations: how many evaluated rounds
    predict a single class for every evaluation input (``predicted_classes`` 1), and the first of them
    (None: never). A diagnostic every result records (``meta.collapse``): a model that predicts one
    class scores exactly that class's share, chance on a balanced set, and very likely never leaves
    it (its representation's units are dead, ``dead_units``)."""
    rounds = [h["round"] for h in history if h.get("predicted_classes") == 1]
    return {"rounds": len(rounds), "first_round": rounds[0] if rounds else None}


def diverged(history: list[dict[str, Any]], classes: int = 10) -> bool:
    """Whether a run diverged: a non-finite loss (:func:`non_finite`) or a test loss that exploded
    (:func:`exploded`). A diverged model says nothing about what training learns or leaks: audits
    exclude it and pages count it."""
    return non_finite(history) or exploded(history, classes)


def non_finite(history: list[dict[str, Any]]) -> bool:
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
    """Where ``config``'s result lives: ``<root>/<algorithm>-<key>.json`` (:func:`results_dir` by default)."""
    return Path(root or results_dir()) / f"{config.algorithm}-{config.key()}.json"


def default_checkpoint_dir() -> Path:
    """Where checkpoints of the repository's own results live: ``$FEDLIB_CHECKPOINT_DIR``, else
    ``$XDG_CACHE_HOME/fedlib/checkpoints`` (``~/.cache/fedlib/checkpoints``). Outside the work tree on
    purpose: a run cut off when a working period ends resumes in the next one on the same machine,
    from any clone of the repository (a checkpoint is keyed by its config and checked on load)."""
    env = folder_setting("FEDLIB_CHECKPOINT_DIR")
    if env is not None:
        return env
    return user_cache() / "checkpoints"


def checkpoint_dir(root: Path | None = None) -> Path:
    """The checkpoint folder of results written under ``root``: the user's cache folder
    (:func:`default_checkpoint_dir`) for the repository's ``data/results`` or when
    ``$FEDLIB_CHECKPOINT_DIR`` is set; ``root/checkpoints`` for any other results folder (a test's,
    a scratch rerun's), so that such runs never resume from each other's checkpoints."""
    root = Path(root or results_dir())
    repository = (REPO_ROOT / "data" / "results").resolve()
    if folder_setting("FEDLIB_CHECKPOINT_DIR") is not None or root.resolve() == repository:
        return default_checkpoint_dir()
    return root / "checkpoints"


def checkpoint_path(config: Config, root: Path | None = None) -> Path:
    """Where ``config``'s checkpoint lives while it trains (:func:`checkpoint_dir`)."""
    return checkpoint_dir(root) / f"{config.key()}.pt"


def model_path(config: Config, root: Path | None = None) -> Path:
    """Where ``config``'s final global model is saved: ``<root>/models/<key>.pt``."""
    return Path(root or results_dir()) / "models" / f"{config.key()}.pt"
