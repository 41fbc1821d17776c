"""The Flower apps driven in one process: no Ray, no network, real Flower messages.

:class:`InProcessGrid` hands each message of :class:`fedlib.flower.server.FedlibStrategy` to
``fedlib.flower.client.app`` directly, one ``Context`` per virtual node, so the Flower code runs in
the test process, where the mutation run sees it (it traces only this process) and where each
mechanism's record of what it drew (:func:`fedlib.privacy.record.drawing`) can be read. It takes
about a second per algorithm, fast enough for the mutation run's test selection.

For every private algorithm of the registry (the cases of ``test_noise_independence``), two rounds
through Flower give the engine's sequential path **bit for bit**: the same clients sampled, the same
noise draws in the same order (by digest), the same privacy spent, the same global model
(``torch.equal``: one thread and the same order of operations on both sides). So the Flower code
hands every mechanism the round and client the engine does: a key edited there (a round or client
replaced by a constant) fails here.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower extra is not installed (make test installs it)")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from test_noise_independence import CASES  # noqa: E402

from fedlib.engine import Executor  # noqa: E402
from fedlib.experiment import Experiment  # noqa: E402
from fedlib.privacy.record import drawing  # noqa: E402


class InProcessGrid:
    """The part of Flower's ``Grid`` that :class:`FedlibStrategy` uses, delivering each message to
    the ClientApp in this process. Without ``data_dir``, node ``i + 1`` plays fedlib client ``i`` (a
    simulation node); with it, the ``clients`` are dealt to ``nodes`` nodes as the deployment deals
    them (node ``n`` plays clients ``n, n + nodes, ...``), each reading only its own data file there."""

    def __init__(self, clients: int, nodes: int | None = None, data_dir=None, config=None):
        if data_dir is None:
            configs = [{"partition-id": i} for i in range(clients)]
        else:
            from fedlib.flower.client import write_node_data

            exp = Experiment(config, torch.device("cpu"))
            for n in range(nodes):
                write_node_data(config, list(range(n, clients, nodes)), data_dir / f"node{n}.pt", exp)
            configs = [{"data-dir": str(data_dir), "node-id": n} for n in range(nodes)]
        run_config = {} if data_dir is None else {"fedlib-node-data": "node{node}.pt"}
        self.contexts = {i + 1: Context(run_id=1, node_id=i + 1, node_config=nc, state=RecordDict(),
                                        run_config=run_config) for i, nc in enumerate(configs)}
        self.delivered: list[tuple[str, int]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list:
        from fedlib.flower import client

        replies = []
        for m in messages:
            self.delivered.append((m.metadata.message_type, m.metadata.dst_node_id))
            replies.append(client.app(m, self.contexts[m.metadata.dst_node_id]))
        return replies


@pytest.fixture
def task_identity():
    """A Flower message needs the run's identity (set by Flower's runtimes in their processes)."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def through_flower(config, rounds: int, nodes: int | None = None, data_dir=None):
    """(global model, each round's record, the draws) of ``rounds`` rounds through Flower's apps
    (with ``nodes`` and ``data_dir``: on that many nodes playing several clients each)."""
    from fedlib.flower import client
    from fedlib.flower.records import to_records
    from fedlib.flower.server import FedlibStrategy, discover

    client._CACHE.clear()
    client._EXPERIMENTS.clear()
    exp = Experiment(config.replace(rounds=rounds), torch.device("cpu"))
    grid = InProcessGrid(config.clients, nodes, data_dir, exp.config)
    history: list[dict] = []
    with drawing() as draws:
        strategy = FedlibStrategy(exp, discover(grid, exp.config), lambda t, rec, wall_s: history.append(rec))
        strategy.start(grid, to_records(exp.gparams)[0], num_rounds=rounds)
    return exp.gparams, history, list(draws)


def through_engine(config, rounds: int):
    exp = Experiment(config.replace(rounds=rounds), torch.device("cpu"))
    history = []
    with drawing() as draws, Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        for t in range(rounds):
            history.append(exp.round(t, ex))
    return exp.gparams, history, list(draws)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # each Flower client sets one thread: the engine's sums the same way
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(CASES))
def test_flower_draws_the_engines_noise_and_gives_its_model(name, task_identity, one_thread):
    config = CASES[name][0].validate()
    model, history, draws = through_flower(config, rounds=2)
    ref_model, ref_history, ref_draws = through_engine(config, rounds=2)
    assert draws and [(d.mechanism, d.digest) for d in draws] == [(d.mechanism, d.digest) for d in ref_draws]
    for key in ("clients", "epsilon_spent", "bytes_up"):
        assert [h.get(key) for h in history] == [h.get(key) for h in ref_history], key
    assert model.keys() == ref_model.keys()
    for k in model:
        assert torch.equal(model[k], ref_model[k]), f"{name}: {k}"


@pytest.mark.parametrize("name", ["ldp_fl", "moon_dpap record"])
def test_nodes_playing_several_clients_get_one_message_a_round_and_give_the_engines_model(
        name, task_identity, one_thread, tmp_path):
    """As in a deployment: 2 nodes play the clients (one of them several), each holding only its own
    clients' data; every round sends one train message per node that has a sampled client, carrying
    all of them, and the node trains them in one reply. Local DP (each client's randomiser keyed on
    its own id) and record-level DP-SGD (each client's Poisson sampling and step noise) give the
    engine's draws and model bit for bit."""
    from fedlib.flower.server import TRANSPORT

    config = CASES[name][0].validate()
    assert config.clients >= 3
    model, history, draws = through_flower(config, rounds=2, nodes=2, data_dir=tmp_path)
    ref_model, ref_history, ref_draws = through_engine(config, rounds=2)
    # the same draws; a node trains its own clients together, so not in the engine's order
    digests = sorted((d.mechanism, d.digest) for d in draws)
    assert digests == sorted((d.mechanism, d.digest) for d in ref_draws)
    assert all(torch.equal(model[k], ref_model[k]) for k in model)
    for h in history:
        assert h[TRANSPORT]["messages"] == h[TRANSPORT]["nodes"] <= 2
        assert h[TRANSPORT]["max_processes_per_node"] == 1
    assert any(h["clients"] > h[TRANSPORT]["messages"] for h in history)  # a message carried several


def test_the_grid_sends_one_query_per_node_then_one_train_per_node_and_round(task_identity, one_thread,
                                                                              tmp_path):
    config = CASES["dp_fedavg fixed"][0].validate()
    from fedlib.flower import client
    from fedlib.flower.records import to_records
    from fedlib.flower.server import TRANSPORT, FedlibStrategy, discover

    client._CACHE.clear()
    exp = Experiment(config.replace(rounds=2), torch.device("cpu"))
    grid = InProcessGrid(config.clients, 2, tmp_path, exp.config)
    rounds: list[dict] = []
    FedlibStrategy(exp, discover(grid, exp.config), lambda t, rec, w: rounds.append(rec)).start(
        grid, to_records(exp.gparams)[0], num_rounds=2)
    queries = [n for kind, n in grid.delivered if kind == "query"]
    trains = [n for kind, n in grid.delivered if kind == "train"]
    assert sorted(queries) == sorted(grid.contexts)
    assert len(trains) == sum(r[TRANSPORT]["messages"] for r in rounds) <= 2 * len(rounds)
    assert sum(r["clients"] for r in rounds) > len(trains)


def test_a_node_asked_for_a_client_it_does_not_hold_refuses_before_training(task_identity, tmp_path):
    from flwr.app import ConfigRecord, Message, MessageType

    from fedlib.flower import client
    from fedlib.flower.records import to_records

    config = CASES["dp_fedavg fixed"][0].validate()
    client._CACHE.clear()
    grid = InProcessGrid(config.clients, 2, tmp_path, config)
    exp = Experiment(config, torch.device("cpu"))
    arrays = to_records(exp.gparams)[0]
    shared, scalars = to_records(exp.algo.broadcast(exp.server_state))
    for asked in ([1], [0, 1], [0, 0], []):  # client 1 is the second node's; a repeat; nobody
        job = ConfigRecord({"config": json.dumps(config.to_dict()), "threads": 1, "round": 0,
                            "clients": json.dumps(asked)})
        msg = Message(RecordDict({"global": arrays, "shared": shared, "shared_scalars": scalars, "job": job}),
                      dst_node_id=1, message_type=MessageType.TRAIN)
        with pytest.raises(ValueError, match="plays clients"):
            client.train_reply(msg, grid.contexts[1])
    assert len(grid.contexts[1].state) == 0  # no client state was touched


def test_flower_gives_the_engines_model_with_dropout_and_pruning(task_identity, one_thread):
    """Dropout masks come from the plan (keyed by round and client) and act on the model's
    representation; MOON-DPAP with dropout, pruning and central DP through Flower is the engine's
    bit for bit too."""
    config = CASES["moon_dpap central"][0].replace(dropout=0.2, prune=True, cosine_lr=True).validate()
    model, history, draws = through_flower(config, rounds=2)
    ref_model, ref_history, ref_draws = through_engine(config, rounds=2)
    assert [d.digest for d in draws] == [d.digest for d in ref_draws]
    assert all(torch.equal(model[k], ref_model[k]) for k in model)
    assert [h["train_loss"] for h in history] == [h["train_loss"] for h in ref_history]


def test_records_refuse_a_key_they_could_not_split_and_encode_nothing_as_nothing():
    from fedlib.flower.records import from_records, to_records

    with pytest.raises(ValueError, match="contains"):
        to_records({"a/b": torch.zeros(1)})
    for empty in (None, {}):
        arrays, scalars = to_records(empty)
        assert len(arrays) == 0 and len(scalars) == 0 and from_records(arrays, scalars) == {}
