"""The Flower server side: a ``Strategy`` whose aggregation is the fedlib algorithm's server step.

:class:`FedlibStrategy` keeps the run's server half (:class:`fedlib.experiment.Experiment`: the global
model, the server state, the accountant, the test set). Each round it samples the clients the
algorithm would sample, groups them by the node that plays them and sends **one message per node**
(the global model, the broadcast and the node's clients of the round), and hands the replies'
uploads, stacked in the order of the sample, to :meth:`Experiment.aggregate` (the algorithm's
``server_update``: central DP noise, adaptive clipping, pruning masks) and the accountant.
Evaluation is centralised on the server's test set, as in fedlib's engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from fedlib.algorithms.base import RoundContext
from fedlib.config import Config
from fedlib.flower.records import from_records, to_records
from fedlib.flower.results import TRANSPORT
from fedlib.tree import index, stack

#: How long the server waits for every node to connect, in seconds.
CONNECT_TIMEOUT_S = 300.0


# pragma: no mutate start (finding the nodes and reporting their errors: not privacy code)
def discover(grid: Grid, config: Config, threads: int = 1) -> dict[int, int]:
    """fedlib client id -> Flower node id, asked of every connected node (a ``query`` message: each
    node says which clients it plays, one or more). Waits until clients 0..N-1 are all played, each
    by one node (nodes playing higher ids sit this run out)."""
    start = time.time()
    job = ConfigRecord({"config": json.dumps(config.to_dict()), "threads": threads})
    asked: dict[int, list[int]] = {}
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            replies = list(grid.send_and_receive([Message(RecordDict({"job": job}), dst_node_id=n,
                                                          message_type=MessageType.QUERY) for n in new]))
            _raise_errors(replies)
            for r in replies:
                played_by = json.loads(str(r.content["info"]["clients"]))
                asked[r.metadata.src_node_id] = [int(c) for c in played_by]
        played = [c for cs in asked.values() for c in cs if c < config.clients]
        if len(set(played)) != len(played):
            raise RuntimeError(f"a client is played by more than one node: {sorted(played)}")
        if set(played) == set(range(config.clients)):
            return {c: n for n, cs in asked.items() for c in cs if c < config.clients}
        if time.time() - start > CONNECT_TIMEOUT_S:
            missing = sorted(set(range(config.clients)) - set(played))
            raise TimeoutError(f"after {CONNECT_TIMEOUT_S} s no connected node plays clients {missing}")
        time.sleep(0.5)


def _raise_errors(replies: list[Message]) -> None:
    errors = [r.error for r in replies if r.has_error()]
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed; first: {errors[0].reason}")


# pragma: no mutate end


# pragma: no mutate start (counting messages and processes: not privacy code)
#: The phases of one train message, from the timestamps its ClientApp records (fedlib.flower.client) and
#: the server's send and receive times: (name, from, to).
PHASES = (("to ClientApp start", "sent", "process_start"),
          ("Flower's process start and imports", "process_start", "fedlib_import_start"),
          ("PyTorch import", "fedlib_import_start", "torch_imported"),
          ("fedlib imports", "torch_imported", "imports_done"),
          ("Flower: app to message", "imports_done", "message_start"),
          ("reading the node's data", "message_start", "data_done"),
          ("client state", "data_done", "train_start"),
          ("training", "train_start", "train_done"),
          ("reply encoding", "train_done", "reply_done"),
          ("reply to the server", "reply_done", "received"))


def message_phases(timing: dict, sent: float, received: float) -> dict[str, float]:
    """Seconds of each :data:`PHASES` phase of one message (a process that served an earlier
    message too has no start-up phases: they are 0)."""
    t = {**timing, "sent": sent, "received": received}
    if t["process_start"] < sent:  # a process that was already running (not one per message)
        for k in ("process_start", "fedlib_import_start", "torch_imported", "imports_done"):
            t[k] = sent
    return {name: max(0.0, t[b] - t[a]) for name, a, b in PHASES}


def transport(replies: list[Message], sent: float | None = None, received: float | None = None) -> dict:
    """A round's train messages, the nodes they went to, the distinct ClientApp processes that
    answered (Flower's Deployment Runtime starts one per message), at most per node, and (with the
    round's send and receive times) the mean seconds of each phase of a message (:data:`PHASES`)."""
    per_node: dict[int, set[int]] = {}
    phases: list[dict[str, float]] = []
    for r in replies:
        per_node.setdefault(r.metadata.src_node_id, set()).add(int(r.content["info"]["pid"]))
        if sent is not None and "timing" in r.content["info"]:
            phases.append(message_phases(json.loads(str(r.content["info"]["timing"])), sent, received))
    out = {"messages": len(replies), "nodes": len(per_node),
           "processes": sum(len(p) for p in per_node.values()),
           "max_processes_per_node": max((len(p) for p in per_node.values()), default=0)}
    if phases:
        out["phases"] = {name: sum(p[name] for p in phases) / len(phases) for name, _, _ in PHASES}
    return out


# pragma: no mutate end


class FedlibStrategy(Strategy):
    """A Flower strategy that runs one fedlib configuration's server.

    ``on_round(t, rec, wall_s)`` receives each round's training metrics (the same record as
    fedlib's engine makes, plus its messages and processes under :data:`TRANSPORT`) and the
    round's wall time, from sending to aggregating.
    """

    def __init__(self, experiment, nodes: dict[int, int], on_round: Callable[[int, dict, float], None],
                 threads: int = 1):
        self.exp = experiment
        self.nodes = nodes
        self.on_round = on_round
        self.job = {"config": json.dumps(experiment.config.to_dict()), "threads": threads}
        self._round: tuple[list[int], RoundContext, float] | None = None

    # pragma: no mutate start (a log line)
    def summary(self) -> None:
        c = self.exp.config
        log(INFO, "\t├── fedlib algorithm: %s (%d clients)", c.algorithm, c.clients)

    # pragma: no mutate end

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        exp, algo = self.exp, self.exp.algo
        t = server_round - 1
        selected = algo.sample_clients(t)
        ctx = RoundContext(t, exp.gparams, algo.hyper(t), algo.broadcast(exp.server_state))
        self._round = (selected, ctx, time.time())
        shared, shared_scalars = to_records(ctx.shared)
        # ``arrays`` is exp.gparams as encoded by aggregate_train (or by main before round 1)
        content = {"global": arrays, "shared": shared, "shared_scalars": shared_scalars}

        by_node: dict[int, list[int]] = {}  # node -> its clients of the round, in sampling order
        for cid in selected:
            by_node.setdefault(self.nodes[cid], []).append(cid)

        def job(cids: list[int]) -> ConfigRecord:  # which clients the node plays in this message
            return ConfigRecord({**self.job, "round": t, "clients": json.dumps(cids)})

        return [Message(RecordDict({**content, "job": job(cids)}), dst_node_id=node,
                        message_type=MessageType.TRAIN, group_id=str(server_round))
                for node, cids in by_node.items()]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self._round is not None
        received = time.time()
        selected, ctx, t0 = self._round
        replies = list(replies)
        _raise_errors(replies)
        dev = self.exp.device
        by_client: dict[int, tuple] = {}  # client -> (its reply's uploads, its metrics, its row there)
        listed: list[int] = []
        for r in replies:
            cids = [int(c) for c in json.loads(str(r.content["info"]["clients"]))]
            up = from_records(r.content["upload"], device=dev)
            met = from_records(r.content["metrics"], device=dev)
            by_client.update({c: (up, met, i) for i, c in enumerate(cids)})
            listed += cids
        if sorted(listed) != sorted(selected):
            raise RuntimeError(f"round {server_round}: replies for clients {sorted(listed)}, "
                               f"expected {sorted(selected)}")
        uploads = metrics = None
        if selected:
            uploads = stack([index(by_client[c][0], by_client[c][2]) for c in selected])
            metrics = stack([index(by_client[c][1], by_client[c][2]) for c in selected])
        rec = self.exp.aggregate(selected, ctx, uploads, metrics)
        self.on_round(ctx.t, {**rec, TRANSPORT: transport(replies, t0, received)}, time.time() - t0)
        numeric = {k: float(v) for k, v in rec.items() if isinstance(v, (int, float)) and v == v}
        return to_records(self.exp.gparams)[0], MetricRecord(numeric)

    # pragma: no mutate start (evaluation is centralised: nothing is sent)
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []  # evaluation is centralised (the server's test set), as in fedlib's engine

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
    # pragma: no mutate end


# pragma: no mutate start (wiring the apps for a simulation or a deployment: not privacy code)
#: How often the ServerApp asks the SuperLink for replies, in seconds (Flower's own grid sleeps 3 s
#: between two asks: up to 3 s of every deployment round spent waiting for a reply already there).
POLL_S = 0.05


class PromptGrid:
    """A Flower ``Grid`` whose ``send_and_receive`` asks for the replies every :data:`POLL_S` seconds
    instead of every 3 s; the same messages go out and the same replies come back (Flower's public
    ``push_messages`` and ``pull_messages``). Everything else is the wrapped grid's."""

    def __init__(self, grid: Grid):
        self._grid = grid

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        pending = set(self._grid.push_messages(messages))
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while pending and (timeout is None or time.time() < end):
            got = list(self._grid.pull_messages(pending))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            if pending:
                time.sleep(POLL_S)
        return replies


def server_app(configs: list[Config] | None, start: Callable[[Config], Any],
               on_round: Callable[[int, dict, float], None], threads: int = 1) -> ServerApp:
    """A ``ServerApp`` that trains ``configs`` one after another with :class:`FedlibStrategy` over
    the same nodes (or, when None, the config in the run config's ``fedlib-config`` entry, a JSON
    string). ``start(config)`` returns the run's server-side :class:`~fedlib.experiment.Experiment`."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        grid = PromptGrid(grid)
        todo = configs or [Config.from_dict(json.loads(str(context.run_config["fedlib-config"]))).validate()]
        for cfg in todo:
            exp = start(cfg)
            nodes = discover(grid, cfg, threads)
            strategy = FedlibStrategy(exp, nodes, on_round, threads)
            strategy.start(grid, to_records(exp.gparams)[0], num_rounds=cfg.rounds_run)

    return app


# pragma: no mutate end


def _deployment_app() -> ServerApp:
    """The ``ServerApp`` for ``flwr run`` on a SuperLink (see the Flower page of the book): the
    config comes from the run config, metrics are logged, the result is written on the server."""
    from fedlib.flower.results import ResultWriter

    writer = ResultWriter.for_deployment()
    return server_app(None, writer.start, writer.on_round)


def __getattr__(name: str) -> Any:  # ``fedlib.flower.server:app`` for Flower's app loader
    if name == "app":
        return _deployment_app()
    raise AttributeError(name)
