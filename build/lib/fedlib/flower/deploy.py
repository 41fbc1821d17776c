"""fedlib on Flower's Deployment Runtime, on one machine: ``python -m fedlib.flower deploy --nodes 3 ...``.

:func:`deploy` starts a SuperLink and ``nodes`` SuperNodes as local processes on 127.0.0.1, gives each
SuperNode a file with only its own clients' training data (clients dealt round-robin over the nodes,
:func:`fedlib.flower.client.write_node_data`), submits the run with ``flwr run`` (the app in
``fedlib/flower/app/``, the config in the run config), waits for it, and stops every process it
started, also when something fails (each in its own process group, terminated then killed; any
process still carrying this deployment's marker in its environment is killed last). The ServerApp
writes the result like :func:`fedlib.run` under ``<results>/flower/`` (``engine: flower``,
``flower.mode: deployment``), with the start-up time, the wall time and the peak memory of the whole
process tree.

What is and is not real here: the processes talk over the network stack (HTTPS on localhost), each
SuperNode runs its ClientApp in a subprocess per message (one message per node and round, carrying
all the node's clients of the round), keeps its clients' state, and holds only its clients' data. By
default every connection is TLS, checked against a CA made for this deployment, and the SuperLink
admits only the SuperNodes whose public keys the deployment registered
(:mod:`fedlib.flower.credentials`; keys in a private temporary folder, deleted at the end);
``secure=False`` is Flower's ``--insecure``. The server learns the clients' sample counts from the
config here, where a real one would learn them from the nodes. The ServerApp trains with the
config's randomness: ``secret`` (OS entropy; the command line's default) or ``seeded`` (public
seeds, so that a deployment reproduces the engine's model: what the tests use).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from fedlib.config import Config, owners_of
from fedlib.flower.credentials import Credentials, make_credentials
from fedlib.results import REPO_ROOT, Result, result_path, results_dir

APP_DIR = Path(__file__).resolve().parent / "app"
#: The environment variable that marks every process a deployment starts (to find stragglers).
MARKER = "FEDLIB_DEPLOYMENT"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked(marker: str) -> list[int]:
    """Processes whose environment holds ``MARKER=marker`` (Linux ``/proc``)."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if f"{MARKER}={marker}".encode() in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
        except (OSError, ValueError):
            continue
    return [pid for pid in found if pid != os.getpid()]


class Deployment:
    """A SuperLink and SuperNodes on this machine, started on entry and stopped on exit."""

    def __init__(self, configs: list[Config], nodes: int, root: Path, workdir: Path, secure: bool = True):
        self.configs, self.nodes, self.root, self.workdir = configs, nodes, Path(root), Path(workdir)
        self.secure = secure
        self.credentials: Credentials | None = None
        self._keys_dir: Path | None = None  # made before the keys, so a failure halfway still removes it
        self.marker = uuid.uuid4().hex
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, MARKER: self.marker, "FLWR_HOME": str(self.workdir / "flwr-home"),
                    "FEDLIB_RESULTS_DIR": str(self.root),
                    "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
                    "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    "FLWR_TELEMETRY_ENABLED": "0", "PYTHONUNBUFFERED": "1"}

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        f = open(self.workdir / log, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def __enter__(self) -> Deployment:
        # a SIGTERM (timeout, kill, a job scheduler) must still stop every process started here:
        # Python runs no cleanup on SIGTERM unless it is turned into an exception
        self._old_term = None
        if threading.current_thread() is threading.main_thread():
            def _terminate(signum, frame):
                raise SystemExit(128 + signum)

            self._old_term = signal.signal(signal.SIGTERM, _terminate)
        try:
            self._set_up()
        except BaseException:
            self.__exit__(None, None, None)  # stop what was started and delete the keys
            raise
        return self

    def _set_up(self) -> None:
        import torch

        from fedlib.experiment import Experiment
        from fedlib.flower.client import write_node_data

        home = self.workdir / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        if self.secure:
            # keys live apart from the work folder (which --keep keeps for its logs) and go at exit
            self._keys_dir = Path(tempfile.mkdtemp(prefix="fedlib-keys-"))
            self.credentials = make_credentials(self._keys_dir / "keys", self.nodes)
            connection = f'root-certificates = "{self.credentials.ca_cert}"\n'
        else:
            connection = "insecure = true\n"
        (home / "config.toml").write_text(f'[superlink]\ndefault = "fedlib"\n\n[superlink.fedlib]\n'
                                          f'address = "127.0.0.1:{self.port}"\n{connection}')
        # the data owner deals each config's clients out to the nodes: one file per node and config
        for i, c in enumerate(self.configs):
            exp = Experiment(c, torch.device("cpu"))
            for n in range(self.nodes):
                clients = list(range(n, c.clients, self.nodes))
                write_node_data(c, clients, self.workdir / f"node{n}-{i}.pt", exp)
        self.t0 = time.time()
        cred = self.credentials
        link_security = (["--ssl-certfile", str(cred.server_cert), "--ssl-keyfile", str(cred.server_key),
                          "--ssl-ca-certfile", str(cred.ca_cert), "--enable-supernode-auth"]
                         if cred else ["--insecure"])
        self._start(["flower-superlink", *link_security, "--port", str(self.port),
                     "--disable-runtime-dependency-installation"], "superlink.log")
        self._wait_for_port(self.port)
        for n in range(self.nodes):
            if cred:
                self.register(cred.nodes[n].public)
            self.start_node(n, cred.nodes[n].private if cred else None, cred.ca_cert if cred else None)
        self.startup_s = time.time() - self.t0

    def register(self, public_key: Path) -> None:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``)."""
        out = subprocess.run(["flwr", "supernode", "register", str(public_key), "fedlib"], env=self.env,
                             cwd=self.workdir, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"could not register a SuperNode key: {(out.stdout + out.stderr)[-500:]}")

    def start_node(self, n: int, private_key: Path | None, ca_cert: Path | None,
                   extra: tuple[str, ...] = (), log: str | None = None) -> subprocess.Popen:
        """Start SuperNode ``n`` (it plays clients ``n, n + nodes, ...``): over TLS checked against
        ``ca_cert`` and signing with ``private_key`` when given, unencrypted when neither is."""
        config = f'data-dir="{self.workdir}" node-id={n}'  # where its data files are, which node it is
        security = ["--insecure"] if ca_cert is None and private_key is None else [
            *(["--root-certificates", str(ca_cert)] if ca_cert else []),
            *(["--auth-supernode-private-key", str(private_key)] if private_key else [])]
        return self._start(["flower-supernode", *security, "--superlink", f"127.0.0.1:{self.port}",
                            "--port", str(free_port()), "--node-config", config, *extra],
                           log or f"supernode{n}.log")

    def _wait_for_port(self, port: int, timeout: float = 120.0) -> None:
        start = time.time()
        while time.time() - start < timeout:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Flower process exited at start-up (see {self.workdir})")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the SuperLink did not open port {port} within {timeout} s")

    def run(self, i: int, timeout_s: float, progress: bool) -> float:
        """Submit config ``i`` with ``flwr run`` and wait for it to end; its wall time."""
        from tqdm import tqdm

        c = self.configs[i]
        # each node reads its data file for this config: name it in the node config of the run
        app = self.workdir / f"app-{i}"
        shutil.copytree(APP_DIR, app, dirs_exist_ok=True)
        overrides = self.workdir / f"run-{i}.toml"
        overrides.write_text(f"fedlib-config = {json.dumps(json.dumps(c.to_dict()))}\n"
                             f'fedlib-node-data = "node{{node}}-{i}.pt"\n')
        bar = tqdm(total=c.rounds_run, desc=f"{c.algorithm} (flower deployment, {self.nodes} nodes)",
                   unit="round", disable=not progress)
        t0 = time.time()
        log = open(self.workdir / f"run-{i}.log", "w")
        p = subprocess.Popen(["flwr", "run", str(app), "fedlib", "--run-config", str(overrides), "--stream"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                             text=True, start_new_session=True)
        self.procs.append(p)
        try:
            for line in p.stdout:  # type: ignore[union-attr]
                log.write(line)
                if "[ROUND " in line:
                    bar.n = int(line.split("[ROUND ", 1)[1].split("/", 1)[0]) - 1
                    bar.refresh()
                if time.time() - t0 > timeout_s:
                    raise TimeoutError(f"the run did not end within {timeout_s} s (see {log.name})")
            p.wait(timeout=60)
        finally:
            log.close()
            bar.n = c.rounds_run if p.returncode == 0 else bar.n
            bar.close()
        if p.returncode != 0:
            raise RuntimeError(f"flwr run failed ({p.returncode}); see {log.name}")
        return time.time() - t0

    def __exit__(self, *exc) -> None:
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        for pid in _marked(self.marker):  # anything that left its process group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._keys_dir is not None:
            shutil.rmtree(self._keys_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Processes of this deployment still alive (should be none after exit)."""
        return _marked(self.marker)


def deploy(configs: list[Config], nodes: int = 3, root: Path | None = None, timeout_s: float = 3600,
           progress: bool = True, keep: Path | None = None, secure: bool = True) -> list[Result]:
    """Run ``configs`` one after another on a local SuperLink and ``nodes`` SuperNodes (see the
    module docstring); return their results (under ``<root>/flower/deployment/``).

    ``secure`` (the default) runs every connection over TLS and admits only the SuperNodes whose
    keys this deployment registered (:mod:`fedlib.flower.credentials`); ``secure=False`` is
    Flower's ``--insecure`` and warns. A config with ``randomness="seeded"`` draws its privacy noise
    and samples its clients from public seeds (reproducible, the engine's numbers, not private):
    it warns too; ``python -m fedlib.flower deploy`` uses ``secret`` unless told otherwise."""
    import warnings

    from fedlib.flower import check_supported, require_flower
    from fedlib.flower.results import MemorySampler, flower_results_dir

    require_flower()
    for c in configs:
        c.validate()
        check_supported(c)
        if not 1 <= nodes <= c.clients:
            raise ValueError(f"--nodes must be in [1, clients = {c.clients}], got {nodes}")
    if not secure:
        warnings.warn("insecure deployment: updates travel unencrypted and any local process can join "
                      "as a SuperNode", stacklevel=2)
    if any(c.randomness == "seeded" and c.algorithm in owners_of("randomness") for c in configs):
        warnings.warn("seeded randomness: the privacy noise and client sampling follow from the public "
                      "config (reproducible, not private); a real deployment uses randomness='secret'",
                      stacklevel=2)
    root = Path(root or results_dir())
    workdir = Path(keep or tempfile.mkdtemp(prefix="fedlib-deploy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    try:
        with MemorySampler() as memory, Deployment(configs, nodes, root, workdir, secure) as d:
            for i, c in enumerate(configs):
                wall = d.run(i, timeout_s, progress)
                path = result_path(c, flower_results_dir(root, "deployment"))
                if not path.exists():
                    raise RuntimeError(f"the ServerApp wrote no result for {c.algorithm}-{c.key()} "
                                       f"(see {workdir})")
                r = Result.load(path, expect=c)
                r.meta["flower"] = {**r.meta.get("flower", {}), "nodes": nodes,
                                    "transport": "tls+supernode-auth" if secure else "insecure",
                                    "startup_s": round(d.startup_s, 2), "run_wall_s": round(wall, 2),
                                    "peak_rss_mb": round(memory.sample(), 1)}
                r.save(path)
                out.append(r)
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return out
