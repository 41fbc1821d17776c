"""fedlib on Flower's Deployment Runtime: a SuperLink and 3 SuperNodes started as local processes,
each SuperNode holding only its own clients' data, run FedAvg and a local-DP algorithm for 2 rounds
and give the engine's global model; every process they started is gone afterwards."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower extra is not installed (make test installs it)")

from fedlib import Config  # noqa: E402
from fedlib.results import model_path  # noqa: E402
from fedlib.run import run  # noqa: E402

SMOKE = dict(rounds=2, train_samples=600, test_samples=200, model="mlp", profile="smoke")
#: FedAvg with 4 clients over 3 nodes (one node plays two), LDP-FL with one client per node.
CONFIGS = [Config(algorithm="fedavg", clients=4, **SMOKE), Config(algorithm="ldp_fl", clients=3, **SMOKE)]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_local_deployment_gives_the_engines_model_and_leaves_nothing_behind(tmp_path):
    from fedlib.flower import deploy as deploy_mod
    from fedlib.flower.results import flower_results_dir

    started = []
    real = deploy_mod.Deployment.__exit__

    def spy(self, *exc):
        started.append(self)
        return real(self, *exc)

    deploy_mod.Deployment.__exit__ = spy
    try:
        results = deploy_mod.deploy(CONFIGS, nodes=3, root=tmp_path, progress=False, timeout_s=900)
    finally:
        deploy_mod.Deployment.__exit__ = real
    assert started and started[0].leftovers() == []  # no SuperLink, SuperNode or app process left
    for c, r in zip(CONFIGS, results, strict=True):
        assert r.meta["engine"] == "flower" and r.meta["flower"]["mode"] == "deployment"
        assert r.meta["flower"]["nodes"] == 3 and r.meta["flower"]["peak_rss_mb"] > 0
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as each ClientApp
        try:
            engine = run(c, engine="sequential", root=tmp_path / "engine", progress=False, device="cpu")
        finally:
            torch.set_num_threads(threads)
        a = torch.load(model_path(c, flower_results_dir(tmp_path, "deployment")), weights_only=True)
        b = torch.load(model_path(c, tmp_path / "engine"), weights_only=True)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5, msg=f"{c.algorithm}: {k}")
        assert [h["clients"] for h in r.history] == [h["clients"] for h in engine.history]


def test_bad_node_counts_are_refused_before_any_process_starts():
    from fedlib.flower.deploy import deploy

    with pytest.raises(ValueError, match="--nodes"):
        deploy([CONFIGS[0]], nodes=5)
    with pytest.raises(ValueError, match="--nodes"):
        deploy([CONFIGS[0]], nodes=0)


SIGTERMED = '''
import os, signal, sys, time
from pathlib import Path
from fedlib.flower.deploy import Deployment


class Sleepers(Deployment):
    """A deployment whose SuperLink and SuperNodes are long sleeps (what is tested is the cleanup)."""

    def _start(self, args, log):
        return super()._start(["sleep", "600"], log)

    def _wait_for_port(self, port):
        pass


work = Path(sys.argv[1])
d = Sleepers([], nodes=2, root=work / "results", workdir=work)
with d:
    print(d.marker, " ".join(str(p.pid) for p in d.procs), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
print("not reached", flush=True)
'''


def test_a_sigterm_stops_every_process_the_deployment_started(tmp_path):
    """A deployment killed with SIGTERM (a timeout, a job scheduler) still stops its SuperLink and
    SuperNodes: Python runs no cleanup on SIGTERM unless the deployment turns it into an exit."""
    import os
    import subprocess
    import sys

    from fedlib.flower.deploy import _marked
    from fedlib.results import REPO_ROOT

    out = subprocess.run([sys.executable, "-c", SIGTERMED, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 128 + 15, out.stderr[-2000:]
    marker, *pids = out.stdout.split()
    assert len(pids) == 3 and "not reached" not in out.stdout
    assert _marked(marker) == []
    for pid in map(int, pids):
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
