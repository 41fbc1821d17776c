"""fedlib's algorithms through Flower (fedlib.flower) compute what fedlib's engine computes.

Each configuration of every algorithm is trained twice, by the engine's sequential path and by
Flower's simulation engine (one Ray session for all of them), and the two final global models must
agree: both consume the same client sampling, minibatches, dropout masks and privacy noise (keyed by
config, round and client; local randomisers run in each client), and the engine runs on one thread
like each Flower client, so they do the same float32 sums (measured: identical bit for bit). atol
1e-5 leaves room for a platform whose kernels round differently across processes (2e-7 was measured
with the engine on two threads) and stays far below the 1e-3 effect of one changed minibatch or
noise draw. (A local randomiser's discrete choices amplify rounding, which is why the engine side
runs on one thread.)
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower extra is not installed (make test installs it)")

from fedlib.config import Config, ConfigError  # noqa: E402
from fedlib.flower import check_supported  # noqa: E402
from fedlib.flower.records import from_records, to_records  # noqa: E402
from fedlib.results import model_path  # noqa: E402
from fedlib.run import run  # noqa: E402

SMOKE = {"clients": 3, "rounds": 2, "train_samples": 600, "test_samples": 200, "profile": "smoke"}
CASES = {
    "fedavg": Config(algorithm="fedavg", **SMOKE),
    "fedprox": Config(algorithm="fedprox", **SMOKE),
    # control variates in the client state and the server's broadcast
    "scaffold": Config(algorithm="scaffold", **SMOKE),
    "feddyn": Config(algorithm="feddyn", **SMOKE),
    "moon": Config(algorithm="moon", **SMOKE),
    # personal models kept on the clients
    "ditto": Config(algorithm="ditto", **SMOKE),
    # every MOON-DPAP component: previous model kept per client, pruning masks broadcast, cosine
    # lr, and client-level central DP (clip on the client, noise and accountant on the server)
    "moon_dpap_dp": Config(algorithm="moon_dpap", cosine_lr=True, prune=True, dp="central",
                           dp_epsilon_per_round=1.0, dropout=0.2, **SMOKE),
    # local DP: each client adds its own noise before replying
    "moon_dpap_local": Config(algorithm="moon_dpap", prune=True, dp="local", dp_epsilon_per_round=4.0,
                              **SMOKE),
    # Poisson client sampling and a scalar broadcast (the adaptive clip norm)
    "dp_fedavg": Config(algorithm="dp_fedavg", client_fraction=0.7, adaptive_clip=True,
                        dp_noise_multiplier=0.1, **SMOKE),
    # the sparse local randomisers, run in each Flower client with its own keyed generators
    "ldp_fl": Config(algorithm="ldp_fl", model="mlp", **SMOKE),
    "signds_fl": Config(algorithm="signds_fl", model="mlp", signds_h=40, **SMOKE),
    "fdl": Config(algorithm="fdl", model="mlp", fdl_r=0.2, **SMOKE),
    "fdl_corrected": Config(algorithm="fdl", model="mlp", fdl_mode="corrected", fdl_k=100, **SMOKE),
}


def test_cases_cover_every_algorithm():
    from fedlib.algorithms import ALGORITHMS

    assert {c.algorithm for c in CASES.values()} == set(ALGORITHMS)


@pytest.fixture(scope="module")
def flower_results(tmp_path_factory):
    from fedlib.flower.simulation import run_flower_many

    root = tmp_path_factory.mktemp("flower")
    configs = [c.validate() for c in CASES.values()]
    return root, dict(zip(CASES, run_flower_many(configs, root=root, cpus=2, progress=False), strict=True))


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(CASES))
def test_flower_gives_the_engines_global_model(name, flower_results, tmp_path):
    root, results = flower_results
    config = CASES[name]
    ours = results[name]
    assert ours.meta["engine"] == "flower" and ours.meta["flower"]["flwr"]
    assert ours.meta["config_key"] == config.key() and len(ours.history) == config.rounds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as each Flower client: the same float32 sums
    try:
        engine = run(config, engine="sequential", root=tmp_path, progress=False)
    finally:
        torch.set_num_threads(threads)
    a = torch.load(model_path(config, root / "flower" / "simulation"), weights_only=True)
    b = torch.load(model_path(config, tmp_path), weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5, msg=f"{name}: {k}")
    for key in ("clients", "bytes_up", "epsilon_spent"):
        assert [h.get(key) for h in ours.history] == pytest.approx([h.get(key) for h in engine.history])
    assert ours.final["train_loss"] == pytest.approx(engine.final["train_loss"], rel=1e-4, nan_ok=True)
    if "privacy" in engine.meta:
        assert ours.meta["privacy"]["statement"] == engine.meta["privacy"]["statement"]


def test_records_round_trip_is_lossless():
    tree = {"delta": {"w": torch.randn(3, 4), "b": torch.tensor(0.25)}, "clip": 0.5}
    back = from_records(*to_records(tree))
    assert torch.equal(back["delta"]["w"], tree["delta"]["w"]) and back["delta"]["b"].shape == ()
    assert back["clip"] == 0.5


def test_every_algorithm_is_supported_and_float64_is_refused_before_any_work():
    from fedlib.algorithms import ALGORITHMS

    for algo in ALGORITHMS:
        check_supported(Config(algorithm=algo))
    with pytest.raises(ConfigError, match="float64"):
        check_supported(Config(precision="float64"))
    from fedlib.flower.__main__ import main

    assert main(["run", "--algorithm", "fedavg", "--clients", "3", "--precision", "float64"]) == 2


@pytest.mark.e2e
def test_cli_json_line(capsys, tmp_path, monkeypatch, flower_results):
    """The command loads an existing Flower result (here the fixture's) and prints one JSON line."""
    root, results = flower_results
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(root))
    from fedlib.flower.__main__ import main

    c = CASES["fedavg"]
    args = ["run", "--algorithm", "fedavg", "--no-progress", "--json"]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in SMOKE.items()]
    assert main(args) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["config_key"] == c.key() and line["engine"] == "flower"
    assert line["test_acc"] == results["fedavg"].final["test_acc"]


def test_agree_within_noise_on_both_sides_of_its_threshold():
    from studies.flower import agree_within_noise

    engine = [60.0, 62.0, 64.0]  # sd 2, one Flower seed: se = 2 * sqrt(1/3 + 1) = 2.31
    assert agree_within_noise(engine, [62.0 + 2 * 2.31 + 0.5 - 0.01])
    assert not agree_within_noise(engine, [62.0 + 2 * 2.31 + 0.5 + 0.01])
    assert agree_within_noise([50.0, 50.0], [50.2])  # no spread: the rounding margin alone
    with pytest.raises(ValueError, match="at least 3 runs"):
        agree_within_noise([50.0], [50.0])


def test_committed_quick_runs_agree_within_noise():
    """SCAFFOLD and MOON-DPAP with client-level DP, committed at the quick profile through both
    engines (the Flower page's evidence), reach the same accuracy within noise."""
    from fedlib.flower.results import flower_results_dir
    from fedlib.results import REPO_ROOT, Result, result_path
    from studies import flower

    committed = REPO_ROOT / "data" / "results"
    configs = flower.configs("quick")
    for label in ("SCAFFOLD", flower.DP_LABEL):
        engine = [result_path(c, committed) for c in configs[label]]
        through = [result_path(c, flower_results_dir(committed)) for c in configs[label]]
        assert all(p.exists() for p in engine + through), f"{label}: committed results missing"
        acc = lambda paths: [100 * Result.load(p).final["test_acc"] for p in paths]  # noqa: E731
        assert flower.agree_within_noise(acc(engine), acc(through)), (label, acc(engine), acc(through))


def test_one_worker_process_serves_several_virtual_nodes():
    """A simulation worker (one Ray actor) plays many virtual nodes in turn: each must get its own
    client, whatever order they come in (the cache once returned the first node's client to all)."""
    from types import SimpleNamespace

    from fedlib.flower import client

    config = CASES["fedavg"].validate()
    client._CACHE.clear()
    nodes = {p: client._node(config, SimpleNamespace(node_config={"partition-id": p}, run_config={}))
             for p in (1, 0, 2, 1)}
    assert {p: n.clients for p, n in nodes.items()} == {0: [0], 1: [1], 2: [2]}
    with pytest.raises(ValueError, match="partition-id"):
        client._node(config, SimpleNamespace(node_config={}, run_config={}))


def test_a_simulation_never_returns_a_deployments_result(tmp_path, monkeypatch):
    """The runtime is part of a result's identity (issue 40): after a deployment of a config, a
    simulation of the same config trains its own (here the engine stands in for Ray)."""
    from fedlib.flower import simulation
    from fedlib.flower.results import flower_results_dir
    from fedlib.results import load_cached

    config = CASES["fedavg"].validate()
    deployed = flower_results_dir(tmp_path, "deployment")
    run(config, root=deployed, engine="sequential", progress=False)
    trained = []

    def simulate(configs, root, *args):
        trained.extend(configs)
        for c in configs:
            run(c, root=root, engine="sequential", progress=False)

    monkeypatch.setattr(simulation, "_simulate", simulate)
    [result] = simulation.run_flower_many([config], root=tmp_path, progress=False)
    assert trained == [config] and result.path.parent == flower_results_dir(tmp_path, "simulation")
    simulation.run_flower_many([config], root=tmp_path, progress=False)
    assert trained == [config]  # its own result is reused the second time
    assert load_cached(config, [deployed]) is not None  # the deployment's is left as it was
    with pytest.raises(ValueError, match="unknown Flower runtime"):
        flower_results_dir(tmp_path, "engine")


def test_the_benchmark_gives_each_path_as_a_multiple_of_the_engine_and_the_page_shows_it():
    """Ratios come from the rows of one run (the engine's first); the Flower page's table keeps them and
    the deployment's ClientApp processes per round, and its sentence names both."""
    from fedlib.flower.bench import with_ratios
    from studies import flower as page

    common = {"method": "FedAvg", "rounds": 10}
    rows = with_ratios([
        {**common, "engine_name": "fedlib engine", "s_per_round": 2.0, "total_s": 20.0, "startup_s": 0.5,
         "peak_rss_mb": 1024.0},
        {**common, "engine_name": "Flower simulation", "s_per_round": 3.0, "total_s": 50.0, "startup_s": 12.0,
         "peak_rss_mb": 2048.0},
        {**common, "engine_name": "Flower deployment (3 SuperNodes)", "s_per_round": 5.0, "total_s": 80.0,
         "startup_s": 20.0, "peak_rss_mb": 3072.0, "clientapp_processes_per_round": 3.0}])
    assert [r["ratio_s_per_round"] for r in rows] == [1.0, 1.5, 2.5]
    assert [r["ratio_total"] for r in rows] == [1.0, 2.5, 4.0]
    import pandas as pd

    table = pd.DataFrame(rows).rename(columns={
        "engine_name": "engine", "s_per_round": "s/round", "startup_s": "start-up (s)",
        "ratio_s_per_round": "x engine per round",
        "clientapp_processes_per_round": "ClientApp processes per round"})
    table["peak memory (GiB)"] = table.pop("peak_rss_mb") / 1024
    text = page.timing_summary(table)
    assert "simulation took 1.50 times" in text and "took 2.50 times" in text
    assert "started 3 ClientApp processes per round" in text
    assert "In the Flower deployment (3 SuperNodes) most of a round is not training" in text
    assert "In the Flower simulation" not in text  # 1.5 times: neither close to the engine nor overhead


def test_a_clientapp_process_imports_only_what_a_client_needs():
    """Issue 66: Flower starts a fresh ClientApp process per message, so what fedlib imports there is
    paid every round: not torchvision (datasets), dp-accounting and scipy (accounting) or pandas."""
    import subprocess
    import sys

    script = ("import sys, fedlib.flower.client\n"
              "from fedlib.config import Config\nfrom fedlib.algorithms import ALGORITHMS\n"
              "from fedlib.models import build_model\n"
              "cfg = Config(algorithm='moon_dpap', dp='central', dp_clip=0.5, clients=4).validate()\n"
              "ALGORITHMS['moon_dpap'](cfg, build_model('cnn')).client_hyper(3)  # a central run's client\n"
              "print(sorted(m for m in ('torchvision', 'dp_accounting', 'scipy', 'pandas')\n"
              "             if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_messages_phases_come_from_its_timestamps():
    from fedlib.flower.server import PHASES, message_phases

    stamps = {"process_start": 10.5, "fedlib_import_start": 11.0, "torch_imported": 12.0,
              "imports_done": 12.2, "message_start": 12.2, "data_done": 12.25, "train_start": 12.25,
              "train_done": 13.0,
              "reply_done": 13.1}
    phases = message_phases(stamps, sent=10.0, received=14.0)
    assert [name for name, _, _ in PHASES] == list(phases)
    assert phases["PyTorch import"] == pytest.approx(1.0) and phases["training"] == pytest.approx(0.75)
    assert sum(phases.values()) == pytest.approx(4.0)  # the phases tile the message, sent to received
    reused = message_phases({**stamps, "process_start": 1.0, "fedlib_import_start": 1.1}, sent=10.0,
                            received=14.0)
    assert reused["PyTorch import"] == reused["fedlib imports"] == 0.0  # a process started earlier


def test_the_prompt_grid_returns_the_same_replies_as_it_polls():
    from types import SimpleNamespace

    from fedlib.flower.server import PromptGrid

    class Fake:
        def __init__(self):
            self.pulls = 0

        def push_messages(self, messages):
            return ["a", "b"]

        def pull_messages(self, ids):
            self.pulls += 1
            ready = {1: ["a"], 3: ["b"]}.get(self.pulls, [])
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in ready if i in ids]

        def get_node_ids(self):
            return [7]

    fake = Fake()
    grid = PromptGrid(fake)
    replies = list(grid.send_and_receive([object(), object()]))
    assert [r.metadata.reply_to_message_id for r in replies] == ["a", "b"] and fake.pulls == 3
    assert grid.get_node_ids() == [7]


def test_the_breakdown_summary_is_read_off_its_table():
    import pandas as pd

    from fedlib.flower.server import PHASES
    from studies import flower as page

    row = {name: 0.1 for name, _, _ in PHASES}
    table = pd.DataFrame([{**row, "PyTorch import": 1.9, "training": 0.6, "fedlib imports": 0.08,
                           "reading the node's data": 0.02}], index=["FedAvg"])
    text = page.breakdown_summary(table)
    assert "took 0.10 s (within the 0.5 s" in text and "PyTorch's import 1.9 s" in text
    over = table.assign(**{"fedlib imports": 0.9})
    assert "(above the 0.5 s" in page.breakdown_summary(over)
