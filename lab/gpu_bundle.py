"""What an offline GPU node needs besides the repository: ``make gpu-bundle`` (``python -m
lab.gpu_bundle``) on a machine with the package registries.

It writes into two git-ignored folders of the repository:

* ``.whl/``: the wheels a bare CUDA image with Python 3.12 and PyTorch lacks (``dp-accounting`` and
  its ``dm-tree`` and ``attrs<24``, ``opacus``; see ``../shared/DEVICE.md``), as ``cp312`` manylinux
  x86-64 wheels, without their dependencies (the image has numpy, scipy, absl-py, mpmath, ...);
* ``.gpudata/``: the datasets' IDX files, xz-compressed (about 27 MB for FashionMNIST, 9 MB for
  MNIST), from ``data/raw/`` (``make data`` fetches them first).

One command to the project's GPU machine carries at most 64 MiB, repository included, and the
repository holds about 34 MiB of results: both datasets do not fit beside it. ``--datasets``
(``make gpu-bundle DATASETS=fashionmnist``) bundles the one the slice's pages train on; a slice trains
only pages whose dataset came with it (the others fail with the fetch's own error, recorded).

``bash tools/gpu-slice.sh MINUTES OUTDIR`` on the node installs the wheels without network (only
if the modules are missing), unpacks the data and runs a slice (:mod:`lab.gpu_slice`).
The node must not install torch or torchvision: it uses its own (a CUDA wheel is far larger than
what travels with a command); every result records the torch version it ran with.
"""

from __future__ import annotations

import gzip
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.data import DATASET_CLASS_NAMES, IDX_FILES, data_dir
from fedlib.results import REPO_ROOT

WHEEL_DIR = REPO_ROOT / ".whl"
DATA_BUNDLE = REPO_ROOT / ".gpudata"
#: The packages the GPU image lacks, pinned as in requirements.txt (dm-tree: dp-accounting's pin).
WHEELS = ("dp-accounting==0.6.0", "dm-tree~=0.1.8", "attrs==23.2.0", "opacus==1.6.0")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
#: What travels with one command to the project's GPU machine, repository included.
CARRY_LIMIT = 64 * 2**20


def download_wheels(out: Path = WHEEL_DIR, python_version: str = "3.12") -> list[Path]:
    """``pip download`` of :data:`WHEELS` for CPython ``python_version`` on x86-64 Linux."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "-d", str(out)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *WHEELS], check=True)
    return sorted(out.glob("*.whl"))


def bundle_data(out: Path = DATA_BUNDLE, root: Path | None = None,
                datasets: list[str] | None = None, preset: int = 6) -> list[Path]:
    """xz-compress the IDX files of ``datasets`` (default: all) from ``root`` (``data/raw``) into
    ``out/<Class>/<file>.xz``, and remove from ``out`` what another dataset or format left there
    (everything under ``out`` travels to the node). ``preset``: lzma's level (6: about 20 % smaller
    than gzip, 40 s for both datasets on a 2-core CPU; the tests use 0, which is fast)."""
    root = Path(root or data_dir())
    datasets = list(DATASET_CLASS_NAMES) if datasets is None else datasets
    unknown = sorted(set(datasets) - set(DATASET_CLASS_NAMES))
    if unknown or not datasets:
        raise ValueError(f"unknown datasets {unknown}; choose from {sorted(DATASET_CLASS_NAMES)}")
    files = []
    for name in datasets:
        src_dir = root / DATASET_CLASS_NAMES[name] / "raw"
        missing = [f for f in IDX_FILES if not (src_dir / f).exists()]
        if missing:
            raise FileNotFoundError(f"{name}: {', '.join(missing)} not in {src_dir} (run make data first)")
    for name in datasets:
        folder = DATASET_CLASS_NAMES[name]
        src_dir = root / folder / "raw"
        (out / folder).mkdir(parents=True, exist_ok=True)
        for f in IDX_FILES:
            dst = out / folder / f"{f}.xz"
            if not dst.exists():
                tmp = dst.with_suffix(".tmp")
                with open(src_dir / f, "rb") as fi, lzma.open(tmp, "wb", preset=preset) as fo:
                    shutil.copyfileobj(fi, fo)
                tmp.replace(dst)
            files.append(dst)
    for stale in [f for f in out.glob("*/*") if f not in files]:
        stale.unlink()
    for d in out.iterdir():
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return files


def carried_datasets(bundle: Path = DATA_BUNDLE) -> set[str] | None:
    """The datasets (``fashionmnist``, ``mnist``) whose files ``bundle`` holds; None without a bundle."""
    if not bundle.is_dir():
        return None
    names = {c: n for n, c in DATASET_CLASS_NAMES.items()}
    return {names[d.name] for d in bundle.iterdir() if d.name in names and any(d.glob("*.[gx]z"))}


def unpack_data(bundle: Path = DATA_BUNDLE, root: Path | None = None) -> list[Path]:
    """On the node: the compressed IDX files of ``bundle`` (``.xz``, or ``.gz`` from older bundles)
    back into ``root`` (``data/raw``)."""
    root = Path(root or data_dir())
    out = []
    for packed in sorted([*bundle.glob("*/*.xz"), *bundle.glob("*/*.gz")]):
        dst = root / packed.parent.name / "raw" / packed.stem
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            tmp = dst.with_suffix(".tmp")
            opener = lzma.open if packed.suffix == ".xz" else gzip.open
            with opener(packed, "rb") as fi, open(tmp, "wb") as fo:
                shutil.copyfileobj(fi, fo)
            tmp.replace(dst)
        out.append(dst)
    return out


def tracked_size() -> int:
    """Bytes of the files git tracks or would track (what travels besides the carried folders)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                         capture_output=True, check=True).stdout.split(b"\0")
    files = [REPO_ROOT / p.decode() for p in out if p]
    return sum(f.stat().st_size for f in files if f.is_file())


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.gpu_bundle", description=__doc__.splitlines()[0])
    p.add_argument("--python-version", default="3.12", help="the node's Python (default 3.12)")
    names = sorted(DATASET_CLASS_NAMES)
    p.add_argument("--datasets", nargs="+", choices=names, default=names,
                   help="datasets to bundle (default: all; both do not fit beside the repository in 64 MiB)")
    args = p.parse_args(argv)
    wheels = download_wheels(python_version=args.python_version)
    data = bundle_data(datasets=args.datasets)
    size = sum(f.stat().st_size for f in [*wheels, *data])
    repo = tracked_size()
    print(f"{len(wheels)} wheels in {WHEEL_DIR.relative_to(REPO_ROOT)}/, {len(data)} data files in "
          f"{DATA_BUNDLE.relative_to(REPO_ROOT)}/: {size / 2**20:.1f} MiB; repository {repo / 2**20:.1f} MiB")
    if size + repo > CARRY_LIMIT:
        print(f"warning: {(size + repo) / 2**20:.1f} MiB is more than the {CARRY_LIMIT // 2**20} MiB that "
              "travels with one command to the project's GPU machine: bundle one dataset "
              "(make gpu-bundle DATASETS=fashionmnist)", file=sys.stderr)
    print("on the node: bash tools/gpu-slice.sh MINUTES OUTDIR   (carry .whl and .gpudata)")
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.gpu_bundle"))
