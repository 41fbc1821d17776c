"""One federated run's state and its round, read in the order they happen.

:class:`Experiment` holds the objects of one run (data on the device, partition, model, algorithm,
client and server states, the accountant) and computes a round in four steps: ``prepare`` (host:
sample the clients, draw their minibatches and noise, build the round context), the client work
(:class:`fedlib.engine.Executor`: ``client_init -> client_step x K -> client_final -> release``),
``aggregate`` (the server step, central DP) and ``_account`` (privacy records -> accountant).
:class:`RunBatch` runs the same round of several experiments through one executor.

Training them to a result (resume, checkpoints, saving) is :mod:`fedlib.run`'s job.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedlib import data as data_mod
from fedlib.algorithms import ALGORITHMS, Algorithm, RoundContext
from fedlib.algorithms.base import RELEASE_PREFIX
from fedlib.config import Config
from fedlib.engine import Executor, Work, make_plan, make_poisson_plan
from fedlib.kernels import noise_ahead
from fedlib.models import build_model
from fedlib.partition import partition
from fedlib.privacy.guarantee import Accountant
from fedlib.privacy.record import Release, check, check_clients, combined_multiplier, recording, total_epsilon
from fedlib.streams import Stream
from fedlib.tree import stack, tmap


@torch.no_grad()
def evaluate(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 500) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y)."""
    acc, loss, _, _ = evaluate_with_units(model, params, x, y, batch_size)
    return acc, loss


def evaluate_with_units(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                        batch_size: int = 500) -> tuple[float, float, float | None, int]:
    """:func:`evaluate`, the share of *dead units*: units of the representation (``fc1``, before its
    ReLU) that are never positive on any of (x, y), so that they pass no signal and get no gradient
    (None for a model without ``fc1``), and how many classes the model predicts on (x, y). A model whose
    representation is all dead predicts one class for every input: a collapse."""
    fc1 = getattr(model, "fc1", None)
    alive: list[torch.Tensor] = []
    hook = fc1.register_forward_hook(lambda m, i, out: alive.append((out > 0).any(0))) if fc1 is not None \
        else None
    correct, loss, predicted = 0.0, 0.0, torch.zeros(0, dtype=torch.bool)
    try:
        for i in range(0, len(y), batch_size):
            logits = functional_call(model, params, (x[i:i + batch_size],))
            loss += F.cross_entropy(logits, y[i:i + batch_size], reduction="sum").item()
            pred = logits.argmax(1)
            correct += (pred == y[i:i + batch_size]).sum().item()
            seen = torch.bincount(pred, minlength=logits.shape[1]).cpu() > 0
            predicted = seen if not len(predicted) else predicted | seen
    finally:
        if hook is not None:
            hook.remove()
    dead = None if not alive else float(1.0 - torch.stack(alive).any(0).float().mean())
    return correct / len(y), loss / len(y), dead, int(predicted.sum())


def init_params(config: Config, model: nn.Module) -> dict[str, torch.Tensor]:
    """Seeded initial global parameters (does not touch the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        fresh = build_model(config.model, dropout=config.dropout, proj_dim=projection_dim(config))
    model.load_state_dict(fresh.state_dict())
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def projection_dim(config: Config) -> int:
    return config.projection_dim if ALGORITHMS[config.algorithm].uses_projection_head else 0


def client_plan(algo: Algorithm, model: nn.Module, parts: list[np.ndarray], selected: list[int], t: int,
                gparams: dict[str, torch.Tensor], device: torch.device):
    """The minibatches (and, under record-level DP-SGD, the step noise) of the clients ``selected``
    in round ``t``; ``parts[i]`` holds the indices of client ``selected[i]``'s samples in the tensor
    the engine will index. Each client's rows depend only on its id and on the order of its own
    samples, so a client that computes its plan alone, on its own data (a Flower SuperNode, whose
    ``parts`` are positions in its local tensor), gets the same batches as in the whole round's."""
    c = algo.config
    common = {"batch_size": c.batch_size, "epochs": c.local_epochs, "seed": c.seed, "round_": t,
              "device": device, "dropout": c.dropout if algo.uses_dropout() else 0.0,
              "repr_dim": getattr(model, "repr_dim", 0)}
    if algo.poisson_records():
        keys = [algo.noise_seed(Stream.RECORD_SAMPLING, t, cid) for cid in selected]
        plan = make_poisson_plan(parts, selected, keys, **common)
    else:
        plan = make_plan(parts, selected, **common)
    noise = algo.step_noise(t, gparams)
    return plan if noise is None else dataclasses.replace(plan, noise=noise)


#: Release statistics that are privacy records (fedlib.privacy.record), not metrics to average.
PRIVACY_RECORDS = frozenset({RELEASE_PREFIX + "privacy_z", RELEASE_PREFIX + "privacy_epsilon"})


class Experiment:
    """The objects of one run (data on the device, partition, model, algorithm, states)."""

    def __init__(self, config: Config, device: torch.device):
        self.config, self.device = config, device
        dtype = torch.float64 if config.precision == "float64" else torch.float32
        self.data = data_mod.load(config.dataset, train_samples=config.train_samples,
                                  test_samples=config.test_samples, seed=config.seed, device=device,
                                  validation_samples=config.validation_samples)
        if dtype != torch.float32:
            self.data.x_train, self.data.x_test = self.data.x_train.to(dtype), self.data.x_test.to(dtype)
        self.parts = partition(self.data.y_train.cpu().numpy(), config)
        self.model = build_model(config.model, dropout=config.dropout,
                                 proj_dim=projection_dim(config)).to(device=device, dtype=dtype)
        self.algo: Algorithm = ALGORITHMS[config.algorithm](config, self.model)
        self.gparams = tmap(lambda p: p.to(device=device, dtype=dtype), init_params(config, self.model))
        self.server_state = self.algo.init_server_state(self.gparams)
        self.client_states = stack([self.algo.init_client_state(self.gparams)
                                    for _ in range(config.clients)])
        self.sizes = torch.tensor([len(p) for p in self.parts], dtype=torch.float32, device=device)
        self.algo.bind_clients([len(p) for p in self.parts])
        self.guarantee = self.algo.guarantee()
        self.accountant = Accountant(self.guarantee.delta) if self.guarantee else None

    def state_dict(self) -> dict:
        return {"gparams": self.gparams, "server_state": self.server_state,
                "client_states": self.client_states,
                "accountant": self.accountant.state_dict() if self.accountant else None}

    def load_state_dict(self, d: dict) -> None:
        self.gparams = tmap(lambda t: t.to(self.device), d["gparams"])
        self.server_state = tmap(lambda t: t.to(self.device), d["server_state"])
        self.client_states = tmap(lambda t: t.to(self.device), d["client_states"])
        if self.accountant is not None:
            self.accountant.load_state_dict(d["accountant"])

    def prepare(self, t: int, offset: int = 0) -> tuple[list[int], Work]:
        """Round ``t``'s sampled clients and the engine's work for them (``offset``: where this
        run's training samples start in the tensor the engine indexes, see :func:`run_many`).
        The work has no plan when no client was sampled (possible under Poisson sampling)."""
        algo = self.algo
        selected = algo.sample_clients(t)
        ctx = RoundContext(t, self.gparams, algo.hyper(t), algo.broadcast(self.server_state))
        if noise_ahead(self.device):
            algo.prefetch_server_noise(ctx)
        if not selected:
            return selected, Work(None, None, ctx)  # type: ignore[arg-type]
        plan = self.plan(t, selected, self.gparams)
        sel = torch.tensor(selected, device=self.device, dtype=torch.long)
        return selected, Work(plan.offset(offset), tmap(lambda s: s[sel], self.client_states), ctx, algo)

    def plan(self, t: int, selected: list[int], gparams: dict[str, torch.Tensor]):
        """The minibatches (and, under record-level DP-SGD, the step noise) of ``selected`` in
        round ``t`` (:func:`client_plan`)."""
        return client_plan(self.algo, self.model, [self.parts[i] for i in selected], selected, t, gparams,
                           self.device)

    def finish(self, selected: list[int], work: Work, outputs) -> dict[str, float]:
        """Update the client states and the global model from the clients' outputs (their uploads
        already released: local DP ran in each client); return the round's training metrics."""
        if not selected:
            return self.aggregate(selected, work.ctx, None, None)
        uploads, new_cstates, metrics = outputs
        sel = torch.tensor(selected, device=self.device, dtype=torch.long)
        self.client_states = tmap(lambda all_, new: all_.index_copy(0, sel, new),
                                  self.client_states, new_cstates)
        return self.aggregate(selected, work.ctx, uploads, metrics)

    def aggregate(self, selected: list[int], ctx: RoundContext, uploads, metrics) -> dict[str, float]:
        """The server's half of a round: update the global model from the uploads of ``selected``
        as they left the clients (stacked in that order; None when no client was sampled) and
        return the round's training metrics (the clients' release statistics, ``release.*``
        metrics, averaged over them). Also the entry point of a server that receives the uploads
        over a network (:mod:`fedlib.flower`)."""
        algo = self.algo
        sel = torch.tensor(selected, device=self.device, dtype=torch.long)
        if not selected:  # the server step still runs (DP noise)
            with recording() as host:
                self.gparams, self.server_state = algo.server_update(
                    self.gparams, self.server_state, algo.empty_uploads(self.gparams), self.sizes[sel], ctx)
            return {"train_loss": float("nan"), "clients": 0, "bytes_up": 0, "bytes_down": 0,
                    **algo.round_metrics(self.server_state, ctx), **self._account(ctx, host, None)}
        with recording() as host:
            self.gparams, self.server_state = algo.server_update(self.gparams, self.server_state,
                                                                 uploads, self.sizes[sel], ctx)
        up = sum(algo.upload_bytes(tmap(lambda u, i=i: u[i], uploads)) for i in range(len(selected)))
        down = len(selected) * 4 * sum(p.numel() for p in self.gparams.values())
        weights = self.sizes[sel] / self.sizes[sel].sum()
        rec = {"train_loss": float((metrics["train_loss"].float() * weights).sum()),
               "clients": len(selected), "bytes_up": int(up), "bytes_down": int(down)}
        if "update_norm" in metrics:  # DP algorithms report each client's update norm before clipping
            norms = metrics["update_norm"].double()  # diagnostics of the raw updates, not private
            rec["update_norm_median"] = float(norms.median())
            q10, q90 = torch.quantile(norms, torch.tensor([0.1, 0.9], dtype=norms.dtype, device=norms.device))
            rec["update_norm_q10"], rec["update_norm_q90"] = float(q10), float(q90)
        rec.update({k[len(RELEASE_PREFIX):]: float(v.double().mean()) for k, v in metrics.items()
                    if k.startswith(RELEASE_PREFIX) and k not in PRIVACY_RECORDS})
        rec.update(algo.round_metrics(self.server_state, ctx))
        rec.update(self._account(ctx, host, metrics, selected))
        return rec

    def _account(self, ctx: RoundContext, host: list[Release], metrics,
                 selected: list[int] | None = None) -> dict[str, float]:
        """Feed this round's privacy to the run's accountant; the epsilon spent so far.

        What the mechanisms recorded (the server's releases in ``host``; each client's, where the
        noise is added in the clients, from its metrics: the least noise and the most epsilon over
        them) must back the event the algorithm promises for its configuration
        (:func:`fedlib.privacy.record.check`), else :class:`~fedlib.privacy.record.PrivacyMismatch`
        stops the run. Where clients are promised different multipliers (``selected``'s
        :meth:`~fedlib.algorithms.base.Algorithm.client_multipliers`), each client's record is checked
        against its own promise (:func:`~fedlib.privacy.record.check_clients`) and the round's event
        is the least protected client's. The accountant is then fed the promised event, which the
        records have shown to be no more private than what was released."""
        if self.accountant is None:
            return {}
        declared = self.algo.privacy_event(ctx)
        where = f"{self.config.algorithm}, round {ctx.t + 1}"
        if self.guarantee.where == "local":
            if metrics is None:  # no client took part: nothing was released
                return {"epsilon_spent": self.accountant.epsilon()}
            zs = metrics.get(RELEASE_PREFIX + "privacy_z")
            eps = metrics.get(RELEASE_PREFIX + "privacy_epsilon")
            promised = self.algo.client_multipliers(list(selected or []))
            if promised is not None:  # clients calibrated apart: each against its own promise
                recorded = [] if zs is None else zs.double().cpu().tolist()
                check_clients(promised, recorded, list(selected), where)
            else:
                z = None if zs is None else float(zs.min())
                check(declared, z, None if eps is None else float(eps.max()), where)
        else:
            check(declared, combined_multiplier(host), total_epsilon(host), where)
        self.accountant.step(declared)
        return {"epsilon_spent": self.accountant.epsilon()}

    def round(self, t: int, executor: Executor) -> dict[str, float]:
        """One global round; returns its training metrics."""
        selected, work = self.prepare(t)
        outputs = executor.run(work.plan, work.cstates, work.ctx) if selected else None
        return self.finish(selected, work, outputs)

    def evaluate(self) -> dict[str, float]:
        """Accuracy and loss of the global model on the evaluation set, with three diagnostics of its
        state: the L2 norm of its weights, the share of its representation's dead units and the number
        of classes it predicts (:func:`evaluate_with_units`; a noisy run's weights random-walk large, its
        units die and it ends predicting one class: :func:`fedlib.results.collapse`)."""
        acc, loss, dead, classes = evaluate_with_units(self.model, self.gparams, self.data.x_test,
                                                       self.data.y_test)
        norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.gparams.values())))
        return {"test_acc": acc, "test_loss": loss, "weight_norm": norm, "predicted_classes": classes,
                **({"dead_units": dead} if dead is not None else {})}

    @torch.no_grad()
    def personal_accuracy(self) -> dict[str, float]:
        """Mean over clients of each personal model's accuracy on the test set re-weighted to the
        client's own label distribution (there is no per-client test split: per-class accuracy
        times the client's class proportions estimates accuracy on its distribution); {} for
        algorithms without personal models."""
        models = self.algo.personal_models(self.client_states)
        if models is None:
            return {}
        x, y, k = self.data.x_test, self.data.y_test, self.data.num_classes
        class_count = torch.bincount(y, minlength=k).clamp_min(1).float()
        accs = []
        for i, part in enumerate(self.parts):
            v = tmap(lambda t, i=i: t[i], models)
            pred = torch.cat([functional_call(self.model, v, (x[j:j + 2000],)).argmax(1)
                              for j in range(0, len(y), 2000)])
            per_class = torch.bincount(y[pred == y], minlength=k).float() / class_count
            p = torch.bincount(self.data.y_train[torch.as_tensor(part, device=y.device)], minlength=k).float()
            accs.append(float((per_class * p / p.sum()).sum()))
        return {"personal_acc": sum(accs) / len(accs)}


class RunBatch:
    """Experiments trained together one round at a time (see :func:`run_many`): their training
    data are concatenated into one tensor that a single :class:`Executor` serves."""

    def __init__(self, experiments: list[Experiment]):
        self.experiments = experiments
        sizes = [len(e.data.y_train) for e in experiments]
        self.offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        if len(experiments) == 1:
            self.x, self.y = experiments[0].data.x_train, experiments[0].data.y_train
        else:
            self.x = torch.cat([e.data.x_train for e in experiments])
            self.y = torch.cat([e.data.y_train for e in experiments])

    def executor(self, path: str, **kwargs) -> Executor:
        return Executor(path, self.experiments[0].algo, self.x, self.y, **kwargs)

    def round(self, t: int, executor: Executor) -> list[dict[str, float]]:
        """Round ``t`` of every run; their clients go to the engine together."""
        prepared = [e.prepare(t, off) for e, off in zip(self.experiments, self.offsets, strict=True)]
        busy = [i for i, (sel, _) in enumerate(prepared) if sel]
        outputs = dict(zip(busy, executor.run_many([prepared[i][1] for i in busy]), strict=True))
        return [e.finish(sel, work, outputs.get(i))
                for i, (e, (sel, work)) in enumerate(zip(self.experiments, prepared, strict=True))]
