"""fedlib installs on its own (issue 77): ``pip install .`` gives the library, with its version and
dependencies, without the study (``studies``) and its lab (``lab``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: In the fresh environment: the library's own smoke run with DP and its accountant, and the study absent.
SCRIPT = """
import importlib.util, fedlib
from fedlib import Config, run
assert "site-packages" in fedlib.__file__, fedlib.__file__
assert importlib.util.find_spec("studies") is None and importlib.util.find_spec("lab") is None
r = run(Config(algorithm="dp_fedavg", clients=10, train_samples=500, test_samples=200, rounds=2,
               dp_noise_multiplier=1.0, dp_clip=0.5), progress=False)
print("version", fedlib.__version__, "epsilon", r.history[-1]["epsilon_spent"], "acc", r.final["test_acc"])
print("results", r.path)
"""


@pytest.mark.e2e
def test_the_library_installs_alone_and_runs_a_private_smoke_run(tmp_path):
    # built from a copy of what the wheel is made of: setuptools writes build/ and *.egg-info beside the
    # sources it builds, and a build/ in the checkout would be a stale second copy of the library (and,
    # were it tracked, would mark every result trained afterwards "-dirty")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fedlib", src / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("fedlib-*.whl")
    import fedlib

    assert wheel.name.startswith(f"fedlib-{fedlib.__version__}-")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert tops == {"fedlib", f"fedlib-{fedlib.__version__}.dist-info"}, tops  # no studies/, no lab/
    assert "Requires-Dist: torch" in metadata and "Requires-Dist: dp-accounting" in metadata

    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    site = Path(subprocess.run([str(env_dir / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    # its dependencies (torch, dp-accounting, ...) from this environment's packages, as a path only: the
    # .pth files there (this checkout's editable fedlib, the study's path) are not read
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEDLIB_RESULTS_DIR")}
    env["FEDLIB_DATA_DIR"] = str(ROOT / "data" / "raw")  # the data this checkout fetched
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", SCRIPT], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"version {fedlib.__version__}" in out.stdout and "epsilon" in out.stdout
    assert list((work / "fedlib-results").glob("dp_fedavg-*.json"))  # beside the work, not in site-packages


def test_the_repository_tracks_no_build_outputs():
    """A package build's outputs (``build/``, ``dist/``, ``*.egg-info``) are ignored, never committed:
    a tracked ``build/lib`` is a stale copy of the library that setuptools may pack into a wheel
    (it copies sources over it and never deletes a module the sources no longer have), and a build
    that rewrites it marks the checkout dirty (:func:`fedlib.results.git_commit`)."""
    tracked = subprocess.run(["git", "ls-files", "--", "build", "dist", "*.egg-info"], cwd=ROOT,
                             capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert tracked == [], tracked[:5]
    probes = ["build/lib/fedlib/x.py", "dist/fedlib-0.whl", "fedlib.egg-info/PKG-INFO"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *probes], cwd=ROOT,
                             capture_output=True, text=True, timeout=30).stdout.split()
    assert ignored == probes, ignored
