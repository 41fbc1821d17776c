"""What an offline GPU node needs besides the repository: ``make gpu-bundle`` (``python -m
lab.gpu_bundle``) on a machine with the package registries.

It writes into two git-ignored folders of the repository:

* ``.whl/``: the wheels a bare CUDA image with Python 3.12 and PyTorch lacks (``dp-accounting`` and
  its ``dm-tree`` and ``attrs<24``, ``opacus``; see ``../shared/DEVICE.md``), as ``cp312`` manylinux
  x86-64 wheels, without their dependencies (the image has numpy, scipy, absl-py, mpmath, ...);
* ``.gpudata/``: the datasets' IDX files, gzipped (about 42 MB for FashionMNIST and MNIST), from
  ``data/raw/`` (``make data`` fetches them first).

``bash tools/gpu-slice.sh MINUTES OUTDIR`` on the node installs the wheels without network (only
if the modules are missing), unpacks the data and runs a slice (:mod:`lab.gpu_slice`).
The node must not install torch or torchvision: it uses its own (a CUDA wheel is far larger than
what travels with a command); every result records the torch version it ran with.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

from fedlib.data import _CLASSES, IDX_FILES, data_dir
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


def bundle_data(out: Path = DATA_BUNDLE, root: Path | None = None) -> list[Path]:
    """Gzip every dataset's IDX files from ``root`` (``data/raw``) into ``out/<Class>/<file>.gz``."""
    root = Path(root or data_dir())
    files = []
    for name, cls in _CLASSES.items():
        src_dir = root / cls.__name__ / "raw"
        missing = [f for f in IDX_FILES if not (src_dir / f).exists()]
        if missing:
            raise FileNotFoundError(f"{name}: {', '.join(missing)} not in {src_dir} (run make data first)")
        (out / cls.__name__).mkdir(parents=True, exist_ok=True)
        for f in IDX_FILES:
            dst = out / cls.__name__ / f"{f}.gz"
            if not dst.exists():
                tmp = dst.with_suffix(".tmp")
                with open(src_dir / f, "rb") as fi, gzip.open(tmp, "wb", compresslevel=6) as fo:
                    shutil.copyfileobj(fi, fo)
                tmp.replace(dst)
            files.append(dst)
    return files


def unpack_data(bundle: Path = DATA_BUNDLE, root: Path | None = None) -> list[Path]:
    """On the node: the gzipped IDX files of ``bundle`` back into ``root`` (``data/raw``)."""
    root = Path(root or data_dir())
    out = []
    for gz in sorted(bundle.glob("*/*.gz")):
        dst = root / gz.parent.name / "raw" / gz.name[:-3]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            tmp = dst.with_suffix(".tmp")
            with gzip.open(gz, "rb") as fi, open(tmp, "wb") as fo:
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
    p = argparse.ArgumentParser(prog="python -m lab.gpu_bundle", description=__doc__.splitlines()[0])
    p.add_argument("--python-version", default="3.12", help="the node's Python (default 3.12)")
    args = p.parse_args(argv)
    wheels = download_wheels(python_version=args.python_version)
    data = bundle_data()
    size = sum(f.stat().st_size for f in [*wheels, *data])
    repo = tracked_size()
    print(f"{len(wheels)} wheels in {WHEEL_DIR.relative_to(REPO_ROOT)}/, {len(data)} data files in "
          f"{DATA_BUNDLE.relative_to(REPO_ROOT)}/: {size / 2**20:.1f} MiB; repository {repo / 2**20:.1f} MiB")
    if size + repo > CARRY_LIMIT:
        print(f"warning: {(size + repo) / 2**20:.1f} MiB is more than the {CARRY_LIMIT // 2**20} MiB that "
              "travels with one command to the project's GPU machine", file=sys.stderr)
    print("on the node: bash tools/gpu-slice.sh MINUTES OUTDIR   (carry .whl and .gpudata)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
