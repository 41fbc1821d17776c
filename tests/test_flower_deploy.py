"""fedlib on Flower's Deployment Runtime: a SuperLink and 3 SuperNodes started as local processes,
over TLS with SuperNode authentication, each SuperNode holding only its own clients' data, run
FedAvg and a local-DP algorithm for 2 rounds and give the engine's global model, with one message
(and one ClientApp process) per SuperNode and round; a SuperNode with an
unregistered key and one without the CA certificate are turned away; every process they started and
every key they made is gone afterwards."""

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
    from fedlib.flower.credentials import node_key
    from fedlib.flower.results import flower_results_dir

    started, intruders = [], {}
    real_enter, real_exit = deploy_mod.Deployment.__enter__, deploy_mod.Deployment.__exit__

    def enter_then_intrude(self):
        real_enter(self)
        cred = self.credentials
        assert cred is not None and (cred.folder.stat().st_mode & 0o777) == 0o700
        stranger = node_key(cred.folder, "stranger")  # a valid key pair the SuperLink never registered
        give_up = ("--max-retries", "2", "--max-wait-time", "30")
        procs = {"unregistered key": self.start_node(0, stranger.private, cred.ca_cert, give_up,
                                                     "stranger.log"),
                 "no CA certificate": self.start_node(1, cred.nodes[1].private, None, give_up, "no-ca.log")}
        for what, p in procs.items():
            intruders[what] = p.wait(timeout=180)
        return self

    def spy_exit(self, *exc):
        started.append(self)
        return real_exit(self, *exc)

    deploy_mod.Deployment.__enter__, deploy_mod.Deployment.__exit__ = enter_then_intrude, spy_exit
    keep = tmp_path / "deployment"
    try:
        with pytest.warns(UserWarning, match="seeded randomness"):
            results = deploy_mod.deploy(CONFIGS, nodes=3, root=tmp_path, progress=False, timeout_s=900,
                                        keep=keep)
    finally:
        deploy_mod.Deployment.__enter__, deploy_mod.Deployment.__exit__ = real_enter, real_exit
    assert started and started[0].leftovers() == []  # no SuperLink, SuperNode or app process left
    assert not started[0].credentials.folder.parent.exists()  # no certificate or key left on disk
    # both intruders gave up with Flower's "could not connect to the SuperLink" (exit code 305)
    assert all(rc != 0 for rc in intruders.values()) and len(intruders) == 2, intruders
    stranger, no_ca = (keep / "stranger.log").read_text(), (keep / "no-ca.log").read_text()
    assert "Exit Code: 305" in stranger and "Failed to activate SuperNode" in stranger
    assert "Exit Code: 305" in no_ca and "CERTIFICATE_VERIFY_FAILED" in no_ca
    assert "https://127.0.0.1" in (keep / "superlink.log").read_text()
    for c, r in zip(CONFIGS, results, strict=True):
        assert r.meta["engine"] == "flower" and r.meta["flower"]["mode"] == "deployment"
        assert r.meta["flower"]["transport"] == "tls+supernode-auth" and r.config.randomness == "seeded"
        assert r.meta["flower"]["nodes"] == 3 and r.meta["flower"]["peak_rss_mb"] > 0
        # one train message per SuperNode and round, each answered by one ClientApp process
        assert r.meta["flower"]["max_clientapp_processes_per_node"] == 1
        assert all(m <= 3 for m in r.meta["flower"]["messages_per_round"])
        assert all(p <= m for p, m in zip(r.meta["flower"]["clientapp_processes_per_round"],
                                          r.meta["flower"]["messages_per_round"], strict=True))
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

    def register(self, public_key):
        pass  # no SuperLink listens: the keys are made (and must be deleted) all the same


work = Path(sys.argv[1])
d = Sleepers([], nodes=2, root=work / "results", workdir=work)
with d:
    print(d.marker, d.credentials.folder, " ".join(str(p.pid) for p in d.procs), flush=True)
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
    marker, keys, *pids = out.stdout.split()
    assert len(pids) == 3 and "not reached" not in out.stdout
    assert _marked(marker) == []
    assert not os.path.exists(keys)  # the keys went with the processes
    for pid in map(int, pids):
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_deployment_credentials_are_private_and_chain_to_their_ca(tmp_path):
    """The CA signs the SuperLink's certificate for 127.0.0.1; the node keys are P-384 keys Flower's
    ``flwr supernode register`` accepts; the folder is 0700 and every file 0600."""
    import ipaddress

    from cryptography import x509
    from flwr.cli.supernode.register import try_load_public_key

    from fedlib.flower.credentials import make_credentials

    cred = make_credentials(tmp_path / "keys", nodes=2)
    assert (cred.folder.stat().st_mode & 0o777) == 0o700
    assert {f.name: f.stat().st_mode & 0o777 for f in cred.folder.iterdir()} == {
        name: 0o600 for name in ("ca.crt", "superlink.crt", "superlink.key", "node0", "node0.pub",
                                 "node1", "node1.pub")}
    ca = x509.load_pem_x509_certificate(cred.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(cred.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer does not match
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    keys = [try_load_public_key(k.public) for k in cred.nodes]
    assert len(set(keys)) == 2  # two different keys
    with pytest.raises(FileExistsError):
        make_credentials(tmp_path / "keys", nodes=1)  # never writes into an existing folder


def test_the_deploy_command_is_secure_and_secret_unless_told_otherwise(monkeypatch):
    from fedlib.flower import __main__ as cli
    from fedlib.flower import deploy as deploy_mod

    seen = []

    def fake_deploy(configs, **kw):
        seen.append((configs[0].randomness, kw["secure"]))
        raise RuntimeError("stop here")

    monkeypatch.setattr(deploy_mod, "deploy", fake_deploy)
    base = ["deploy", "--algorithm", "dp_fedavg", "--clients", "4", "--rounds", "1"]
    assert cli.main(base) == 1
    assert cli.main([*base, "--randomness", "seeded", "--insecure"]) == 1
    # an algorithm without a privacy mechanism reads no randomness: it keeps the default (issue 65)
    assert cli.main(["deploy", "--algorithm", "fedavg", "--clients", "4", "--rounds", "1"]) == 1
    assert seen == [("secret", True), ("seeded", False), ("seeded", True)]
