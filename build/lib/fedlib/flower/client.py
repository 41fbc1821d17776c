"""The Flower ``ClientApp``: a SuperNode that plays one or more fedlib clients.

A ``train`` message carries the fedlib config (JSON), the round, **every client the node plays in
that round** (one message per node and round), the global model and what the algorithm broadcasts.
The node trains those clients in one process with the engine's own functions on their data
(:func:`fedlib.engine.run_sequential`), each ending with the algorithm's client-side randomiser
(local DP) keyed on the client's id; it keeps each client's state across rounds in
``context.state`` and replies once, with every client's upload and training metrics stacked in the
order the message listed them. A ``query`` message asks which fedlib clients the node plays.

Where a node's data come from:

* **deployment** (Flower's Deployment Runtime, :mod:`fedlib.flower.deploy`): the node config gives
  a folder (``data-dir``) and the node's number (``node-id``); the run config names the file of the
  run's data there (``fedlib-node-data``, e.g. ``node{node}-0.pt``), holding only this node's clients'
  samples, given to it by whoever owns the data (:func:`write_node_data`); the node never sees
  anyone else's data;
* **simulation** (:mod:`fedlib.flower.simulation`): the node config's ``partition-id`` names the one
  client it plays, and every virtual node derives the partition from the shared config and seed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedlib.algorithms.base import RoundContext
from fedlib.config import Config
from fedlib.engine import run_sequential
from fedlib.flower.records import from_records, to_records
from fedlib.tree import index, stack

app = ClientApp()

import fedlib  # noqa: E402 (already imported: the package's own import times)


def _process_start() -> float:
    """When this process started (epoch seconds; Linux ``/proc``, 10 ms resolution; else now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


#: What this ClientApp process did before its first message: started, began importing fedlib, had
#: PyTorch, had the ClientApp module (epoch seconds; a deployment starts one process per message).
STARTUP = {"process_start": _process_start(), "fedlib_import_start": fedlib.IMPORT_STARTED,
           "torch_imported": fedlib.TORCH_IMPORTED, "imports_done": time.time()}

#: The nodes this process plays for its current config, by (config key, node); a simulation worker
#: serves many virtual nodes of one run in turn.
_CACHE: dict[tuple[str, str], NodeClients] = {}
#: The current config's experiment (dataset and partition) in a simulation worker.
_EXPERIMENTS: dict[str, object] = {}
STATE_PREFIX = "fedlib.client_state."


class NodeClients:
    """What one node needs to play its clients: their data only (concatenated in client order),
    the model, the algorithm, and the initial client state (from the seeded initial model, as the
    engine's)."""

    def __init__(self, config: Config, x: dict[int, torch.Tensor], y: dict[int, torch.Tensor],
                 sizes: list[int]):
        from fedlib.algorithms import ALGORITHMS
        from fedlib.experiment import init_params, projection_dim
        from fedlib.models import build_model

        self.clients = sorted(x)
        self.x = torch.cat([x[c] for c in self.clients])
        self.y = torch.cat([y[c] for c in self.clients])
        starts = np.cumsum([0] + [len(y[c]) for c in self.clients])
        #: client id -> the positions of its samples in ``x`` and ``y``
        self.rows = {c: np.arange(starts[i], starts[i + 1]) for i, c in enumerate(self.clients)}
        # float32, as the model is built: Flower refuses float64 configs (fedlib.flower.check_supported)
        self.model = build_model(config.model, dropout=config.dropout, proj_dim=projection_dim(config))
        self.algo = ALGORITHMS[config.algorithm](config, self.model)
        self.algo.bind_clients(sizes)  # the client sizes are public (record-level DP calibrates on them)
        self.init_params = init_params(config, self.model)

    def examples(self, cid: int) -> int:
        return len(self.rows[cid])

    def initial_state(self, cid: int):
        return self.algo.init_client_state(self.init_params)

    def run(self, cids: list[int], t: int, cstates, ctx: RoundContext):
        """Round ``t`` of clients ``cids`` (their states stacked in that order), each on its own
        samples: the engine's plan for these clients on positions in the node's tensors (each
        client's minibatches depend only on its id and its own samples, see
        :func:`fedlib.experiment.client_plan`), then the engine's sequential path."""
        from fedlib.experiment import client_plan

        plan = client_plan(self.algo, self.model, [self.rows[c] for c in cids], cids, t, ctx.gparams,
                           self.x.device)
        return run_sequential(self.algo, self.x, self.y, plan, cstates, ctx)


# pragma: no mutate start (which data a node holds and plays, its thread count: not privacy code)
def write_node_data(config: Config, clients: list[int], path: Path, experiment=None) -> Path:
    """The data owner's side: a file holding only ``clients``' training samples (in the order of their
    partition), for one SuperNode (see the module docstring), and every client's sample
    count (public, as in Opacus). Tensors and plain data only (loaded with ``weights_only``)."""
    from fedlib.experiment import Experiment
    from fedlib.results import atomic_torch_save

    exp = experiment or Experiment(config, torch.device("cpu"))
    payload = {"config_key": config.key(), "sizes": [len(p) for p in exp.parts],
               "x": {cid: exp.data.x_train[torch.as_tensor(exp.parts[cid])].clone() for cid in clients},
               "y": {cid: exp.data.y_train[torch.as_tensor(exp.parts[cid])].clone() for cid in clients}}
    atomic_torch_save(payload, Path(path))
    return Path(path)


def _node(config: Config, context: Context) -> NodeClients:
    """This node's clients for ``config``, built once per config and node. A simulation worker
    process serves many virtual nodes in turn, so the cache is keyed by the node too (each node
    plays its own client) and the shared experiment (dataset and partition) is built once per
    config and process."""
    deployed = "data-dir" in context.node_config
    if not deployed and "partition-id" not in context.node_config:
        raise ValueError("the SuperNode needs --node-config 'data-dir=\"DIR\" node-id=N' (deployment) or "
                         "'partition-id=<fedlib client id>' (simulation)")
    key = config.key()
    ident = (f"node{int(context.node_config['node-id'])}" if deployed
             else f"partition{int(context.node_config['partition-id'])}")
    if (key, ident) in _CACHE:
        return _CACHE[key, ident]
    for old in [k for k in _CACHE if k[0] != key]:  # a process serves one run at a time
        del _CACHE[old]
    if deployed:  # this node's own file for this run
        name = str(context.run_config["fedlib-node-data"]).format(node=int(context.node_config["node-id"]))
        # memory-mapped: the node's tensors are read as the clients touch them, not copied up front
        d = torch.load(Path(str(context.node_config["data-dir"])) / name, weights_only=True, mmap=True)
        if d["config_key"] != key:
            raise ValueError(f"the node's data file was written for config {d['config_key']}, not {key}")
        node = NodeClients(config, d["x"], d["y"], d["sizes"])
    else:
        from fedlib.experiment import Experiment

        if key not in _EXPERIMENTS:
            _EXPERIMENTS.clear()
            _EXPERIMENTS[key] = Experiment(config, torch.device("cpu"))
        exp = _EXPERIMENTS[key]
        cid = int(context.node_config["partition-id"])
        part = torch.as_tensor(exp.parts[cid])
        node = NodeClients(config, {cid: exp.data.x_train[part]}, {cid: exp.data.y_train[part]},
                           [len(p) for p in exp.parts])
    _CACHE[key, ident] = node
    return node


def _job(msg: Message) -> tuple[dict, Config]:
    job = msg.content["job"]
    torch.set_num_threads(int(job.get("threads", 1)))
    return job, Config.from_dict(json.loads(job["config"]))


# pragma: no mutate end


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which fedlib clients this node plays (and load their data)."""
    _, config = _job(msg)
    node = _node(config, context)
    info = ConfigRecord({"clients": json.dumps(node.clients),
                         "num-examples": json.dumps([node.examples(c) for c in node.clients])})
    return Message(RecordDict({"info": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of the algorithm's local training for the clients of this node the message names."""
    return train_reply(msg, context)


def train_reply(msg: Message, context: Context) -> Message:
    """The reply to a ``train`` message: the round of every client it names (each one's local
    randomiser included, keyed on the round and on that client), their new states kept in
    ``context.state``, and one reply carrying every client's upload and metrics, stacked in the
    order of the message's ``clients``. Not decorated, so that the mutation run of the privacy code
    can edit it (mutmut leaves decorated functions alone)."""
    started = time.time()
    job, config = _job(msg)
    node = _node(config, context)
    data_done = time.time()
    cids, t = [int(c) for c in json.loads(str(job["clients"]))], int(job["round"])
    foreign = [c for c in cids if c not in node.rows]
    if foreign or not cids or len(set(cids)) != len(cids):
        raise ValueError(f"this node plays clients {node.clients}; the message asks for {cids}")
    algo = node.algo
    gparams = from_records(msg.content["global"])
    shared = from_records(msg.content["shared"], msg.content["shared_scalars"])
    ctx = RoundContext(t, gparams, algo.client_hyper(t), shared)
    prefix = f"{STATE_PREFIX}{config.key()}."
    for old in [k for k in context.state if k.startswith(STATE_PREFIX) and not k.startswith(prefix)]:
        del context.state[old]  # a node serves one run at a time: drop an earlier run's states

    def state(c: int):  # the client's state from its last round here, or its initial one
        key = f"{prefix}{c}"
        return from_records(context.state[key]) if key in context.state else node.initial_state(c)

    cstates = [state(c) for c in cids]
    # the engine's sequential path for these clients, each one's local randomiser (local DP) included
    train_start = time.time()
    uploads, new_cstates, metrics = node.run(cids, t, stack(cstates), ctx)
    train_done = time.time()
    for i, c in enumerate(cids):
        context.state[f"{prefix}{c}"] = to_records(index(new_cstates, i))[0]
    upload, _ = to_records(uploads)
    metric_arrays, _ = to_records(metrics)
    # the clients answered for, and the process that trained them (the server counts processes per
    # round); no sample counts: the server weights by the sizes it derives from the config
    timing = {**STARTUP, "message_start": started, "data_done": data_done, "train_start": train_start,
              "train_done": train_done, "reply_done": time.time()}
    info = ConfigRecord({"clients": json.dumps(cids), "pid": os.getpid(), "timing": json.dumps(timing)})
    return Message(RecordDict({"upload": upload, "metrics": metric_arrays, "info": info}), reply_to=msg)
