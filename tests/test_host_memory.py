"""Freed host memory kept for the next step (:mod:`fedlib.host_memory`): it acts, it is reused, and
it changes no number. Each case runs in a child process: the setting is process-wide and once set
stays for the process's life."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from fedlib import kernels

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: Allocates, touches and frees a 64 MiB tensor (above glibc's largest mmap threshold, so by default
#: it is mapped afresh each time) and reports the page faults of the last allocation.
FAULTS = """
import json, resource, torch
from fedlib.kernels import prepare_host_memory
state = prepare_host_memory(torch.device("cpu"))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    torch.ones(16 * 2**20)
f0 = faults()
torch.ones(16 * 2**20)
print(json.dumps({"state": state, "faults": faults() - f0}))
"""

#: Trains a small run on the vectorized path (lane stacks: the large allocations) and on the parallel
#: path (forked workers: they inherit the setting) and prints its models' digests.
TRAIN = """
import hashlib, json, sys, tempfile, torch
from fedlib import Config, run
from fedlib.results import model_path
from fedlib.host_memory import state
config = Config(algorithm="fdl", model="mcmahan_cnn", clients=4, train_samples=400, test_samples=100,
                rounds=2, min_client_samples=10, profile="smoke")
out = {}
for engine in ("vectorized", "parallel"):
    with tempfile.TemporaryDirectory() as root:
        run(config, engine=engine, device="cpu", root=root, progress=False)
        params = torch.load(model_path(config, root), weights_only=True)
        h = hashlib.sha256()
        for k in sorted(params):
            h.update(params[k].numpy().tobytes())
        out[engine] = h.hexdigest()
out["state"] = state()
print(json.dumps(out))
"""


def _child(code: str, mode: str) -> dict:
    env = {**os.environ, "FEDLIB_HOST_MEMORY": mode}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_instead_of_mapped_afresh():
    """With ``reuse`` a 64 MiB allocation made after an equal one was freed touches pages it already
    has: (almost) no page faults. Bound: 1 % of its 16,384 4-KiB pages (a few faults may come from
    the interpreter's own bookkeeping). Under ``system`` the count depends on the kernel's page size
    and transparent huge pages, so it is only reported beside."""
    reuse = _child(FAULTS, "reuse")
    system = _child(FAULTS, "system")
    assert system["state"] == "system"
    if GLIBC:
        assert reuse["state"] == "reuse"
        assert reuse["faults"] < 164, (reuse, system)
    else:  # not glibc: nothing to set, and fedlib says so
        assert reuse["state"] == "unavailable"


@pytest.mark.heavy  # two training runs (~20 s): make test-full
def test_training_gives_the_same_bits_with_and_without_reuse():
    """Where memory comes from is not arithmetic: the same run, trained with freed memory kept and
    with glibc's own behaviour, ends with bit-identical models on both CPU engine paths."""
    reuse = _child(TRAIN, "reuse")
    system = _child(TRAIN, "system")
    assert reuse["state"] == ("reuse" if GLIBC else "unavailable") and system["state"] == "system"
    assert reuse["vectorized"] == system["vectorized"]
    assert reuse["parallel"] == system["parallel"]


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="host_memory must be one of"):
        kernels.set_kernel_options(host_memory="never")
    env = {**os.environ, "FEDLIB_HOST_MEMORY": "sometimes"}
    proc = subprocess.run([sys.executable, "-c", "import fedlib.kernels"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode != 0 and "FEDLIB_HOST_MEMORY must be one of" in proc.stderr

