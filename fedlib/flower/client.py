"""The Flower ``ClientApp``: one fedlib client per SuperNode.

A ``train`` message carries the fedlib config (JSON), the round, the global model and what the
algorithm broadcasts; the client runs the algorithm's own client functions on its partition
(:func:`fedlib.engine.run_sequential` for one client), which ends with the algorithm's
client-side randomiser (local DP) keyed on its own client id, keeps its state across rounds in
``context.state`` and replies with the upload and its training metrics. A ``query`` message asks
which fedlib client the node is (its ``partition-id``).
"""

from __future__ import annotations

import json

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedlib.algorithms.base import RoundContext
from fedlib.config import Config
from fedlib.engine import run_sequential
from fedlib.flower.records import from_records, to_records
from fedlib.tree import index, stack

app = ClientApp()

#: The last config's experiment in this process (data, partition, model, algorithm): a
#: simulation worker serves many virtual nodes of one run, and each needs the same objects.
_CACHE: dict[str, object] = {}
STATE_PREFIX = "fedlib.client_state."


def _experiment(config: Config):
    """The run's objects on this node (built once per config and process)."""
    from fedlib.run import Experiment

    key = config.key()
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = Experiment(config, torch.device("cpu"))
    return _CACHE[key]


def client_id(context: Context) -> int:
    """The fedlib client this node plays: ``partition-id`` from its node config."""
    if "partition-id" not in context.node_config:
        raise ValueError("the SuperNode needs --node-config 'partition-id=<fedlib client id>'")
    return int(context.node_config["partition-id"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which fedlib client this node is (and load the run's data)."""
    job = msg.content["job"]
    config = Config.from_dict(json.loads(job["config"]))
    torch.set_num_threads(int(job.get("threads", 1)))
    exp = _experiment(config)
    cid = client_id(context)
    info = ConfigRecord({"client": cid, "num-examples": len(exp.parts[cid])})
    return Message(RecordDict({"info": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of the algorithm's local training on this node's partition."""
    job = msg.content["job"]
    config = Config.from_dict(json.loads(job["config"]))
    torch.set_num_threads(int(job.get("threads", 1)))
    exp = _experiment(config)
    algo, cid, t = exp.algo, client_id(context), int(job["round"])
    gparams = from_records(msg.content["global"])
    shared = from_records(msg.content["shared"], msg.content["shared_scalars"])
    ctx = RoundContext(t, gparams, algo.hyper(t), shared)
    state_key = STATE_PREFIX + config.key()
    for old in [k for k in context.state if k.startswith(STATE_PREFIX) and k != state_key]:
        del context.state[old]  # a node serves one run at a time: drop an earlier run's state
    if state_key in context.state:
        cstate = from_records(context.state[state_key])
    else:  # the state the engine starts every client with (from the seeded initial model)
        cstate = index(exp.client_states, cid)
    plan = exp.plan(t, [cid], gparams)
    # the engine's sequential path for this one client, its local randomiser (local DP) included
    uploads, new_cstates, metrics = run_sequential(algo, exp.data.x_train, exp.data.y_train, plan,
                                                   stack([cstate]), ctx)
    context.state[state_key] = to_records(index(new_cstates, 0))[0]
    upload, _ = to_records(index(uploads, 0))
    metric_arrays, _ = to_records(index(metrics, 0))
    info = ConfigRecord({"client": cid, "num-examples": len(exp.parts[cid])})
    return Message(RecordDict({"upload": upload, "metrics": metric_arrays, "info": info}), reply_to=msg)


