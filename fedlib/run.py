"""One federated run, end to end: config -> data -> partition -> rounds -> Result.

:func:`run` validates the config before any work, loads a cached result when the same
config was run before (unless ``force``), checkpoints every few rounds so an
interrupted run resumes where it stopped (with the same final result), and writes the
result atomically.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from fedlib import data as data_mod
from fedlib.algorithms import ALGORITHMS, Algorithm, RoundContext
from fedlib.config import Config
from fedlib.engine import PATHS, Executor, default_path, make_plan
from fedlib.models import build_model
from fedlib.partition import partition
from fedlib.results import (
    Result,
    atomic_torch_save,
    checkpoint_path,
    model_path,
    provenance,
    result_path,
    results_dir,
)
from fedlib.tree import stack, tmap


def pick_device(device: str | torch.device | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@torch.no_grad()
def evaluate(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 500) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y)."""
    correct, loss = 0.0, 0.0
    for i in range(0, len(y), batch_size):
        logits = functional_call(model, params, (x[i:i + batch_size],))
        loss += F.cross_entropy(logits, y[i:i + batch_size], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + batch_size]).sum().item()
    return correct / len(y), loss / len(y)


def init_params(config: Config, model: nn.Module) -> dict[str, torch.Tensor]:
    """Seeded initial global parameters (does not touch the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        fresh = build_model(config.model, dropout=config.dropout, proj_dim=projection_dim(config))
    model.load_state_dict(fresh.state_dict())
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def projection_dim(config: Config) -> int:
    return config.projection_dim if ALGORITHMS[config.algorithm].uses_projection_head else 0


class Experiment:
    """The objects of one run (data on the device, partition, model, algorithm, states)."""

    def __init__(self, config: Config, device: torch.device):
        self.config, self.device = config, device
        self.data = data_mod.load(config.dataset, train_samples=config.train_samples,
                                  test_samples=config.test_samples, seed=config.seed, device=device)
        self.parts = partition(self.data.y_train.cpu().numpy(), config)
        self.model = build_model(config.model, dropout=config.dropout,
                                 proj_dim=projection_dim(config)).to(device)
        self.algo: Algorithm = ALGORITHMS[config.algorithm](config, self.model)
        self.gparams = tmap(lambda p: p.to(device), init_params(config, self.model))
        self.server_state = self.algo.init_server_state(self.gparams)
        self.client_states = stack([self.algo.init_client_state(self.gparams)
                                    for _ in range(config.clients)])
        self.sizes = torch.tensor([len(p) for p in self.parts], dtype=torch.float32, device=device)

    def state_dict(self) -> dict:
        return {"gparams": self.gparams, "server_state": self.server_state,
                "client_states": self.client_states}

    def load_state_dict(self, d: dict) -> None:
        self.gparams = tmap(lambda t: t.to(self.device), d["gparams"])
        self.server_state = tmap(lambda t: t.to(self.device), d["server_state"])
        self.client_states = tmap(lambda t: t.to(self.device), d["client_states"])

    def round(self, t: int, executor: Executor) -> dict[str, float]:
        """One global round; returns its training metrics."""
        c, algo = self.config, self.algo
        selected = algo.sample_clients(t)
        sel = torch.tensor(selected, device=self.device, dtype=torch.long)
        ctx = RoundContext(t, self.gparams, algo.hyper(t), algo.broadcast(self.server_state))
        if not selected:  # possible under Poisson sampling: the server step still runs (noise)
            self.gparams, self.server_state = algo.server_update(
                self.gparams, self.server_state, algo.empty_uploads(self.gparams), self.sizes[sel], ctx)
            return {"train_loss": float("nan"), "clients": 0, "bytes_up": 0, "bytes_down": 0,
                    **algo.round_metrics(self.server_state, ctx)}
        plan = make_plan([self.parts[i] for i in selected], selected, batch_size=c.batch_size,
                         epochs=c.local_epochs, seed=c.seed, round_=t, device=self.device,
                         dropout=c.dropout if algo.uses_dropout() else 0.0,
                         repr_dim=getattr(self.model, "repr_dim", 0))
        cstates = tmap(lambda s: s[sel], self.client_states)
        uploads, new_cstates, metrics = executor.run(plan, cstates, ctx)
        uploads = algo.privatize(uploads, selected, ctx)
        self.client_states = tmap(lambda all_, new: all_.index_copy(0, sel, new),
                                  self.client_states, new_cstates)
        self.gparams, self.server_state = algo.server_update(self.gparams, self.server_state,
                                                             uploads, self.sizes[sel], ctx)
        up = sum(algo.upload_bytes(tmap(lambda u, i=i: u[i], uploads)) for i in range(len(selected)))
        down = len(selected) * 4 * sum(p.numel() for p in self.gparams.values())
        weights = self.sizes[sel] / self.sizes[sel].sum()
        rec = {"train_loss": float((metrics["train_loss"] * weights).sum()),
               "clients": len(selected), "bytes_up": int(up), "bytes_down": int(down)}
        if "update_norm" in metrics:  # DP algorithms report each client's update norm before clipping
            rec["update_norm_median"] = float(metrics["update_norm"].median())
        rec.update(algo.round_metrics(self.server_state, ctx))
        return rec


def _train(exp: Experiment, executor: Executor, bar, history: list[dict], ckpt: Path,
           checkpoint_every: int) -> list[dict]:
    config = exp.config
    for t in bar:
        t0 = time.time()
        rec = {"round": t + 1, **exp.round(t, executor)}
        rec["wall_s"] = time.time() - t0
        if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds:
            t1 = time.time()
            rec["test_acc"], rec["test_loss"] = evaluate(exp.model, exp.gparams,
                                                         exp.data.x_test, exp.data.y_test)
            rec.update(exp.algo.extra_metrics(exp, final=t + 1 == config.rounds))
            rec["eval_s"] = time.time() - t1
            bar.set_postfix(acc=f"{rec['test_acc']:.4f}", loss=f"{rec['test_loss']:.3f}")
        else:
            rec["test_acc"] = rec["test_loss"] = None
        history.append(rec)
        if (t + 1) % checkpoint_every == 0 and t + 1 < config.rounds:
            atomic_torch_save({"state": exp.state_dict(), "history": history, "next_round": t + 1}, ckpt)
    return history


def run(config: Config, *, engine: str = "auto", device: str | torch.device | None = None,
        force: bool = False, root: Path | None = None, checkpoint_every: int = 5,
        progress: bool = True) -> Result:
    """Run ``config`` (or load it from the cache) and return its :class:`Result`.

    ``engine``: ``auto`` (vectorized on a GPU; on a CPU parallel worker processes when
    there are two or more cores, else sequential), ``sequential``, ``parallel`` or
    ``vectorized``; the choice does not change the result beyond float rounding.
    """
    config.validate()
    if engine != "auto" and engine not in PATHS:
        raise ValueError(f"unknown engine {engine!r}; choose from {('auto', *PATHS)}")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    root = Path(root or results_dir())
    out = result_path(config, root)
    if out.exists() and not force:
        result = Result.load(out)
        _log_run(result, cached=True)
        return result

    dev = pick_device(device)
    path = default_path(dev) if engine == "auto" else engine
    start = time.time()
    exp = Experiment(config, dev)
    history: list[dict] = []
    first_round = 0
    ckpt = checkpoint_path(config, root)
    if ckpt.exists() and not force:
        saved = torch.load(ckpt, map_location=dev, weights_only=False)
        exp.load_state_dict(saved["state"])
        history, first_round = saved["history"], saved["next_round"]
    elapsed_before = sum(h["wall_s"] for h in history)

    bar = tqdm(range(first_round, config.rounds), desc=f"{config.algorithm} ({path}, {dev.type})",
               unit="round", disable=not progress, initial=first_round, total=config.rounds)
    with Executor(path, exp.algo, exp.data.x_train, exp.data.y_train) as executor:
        history = _train(exp, executor, bar, history, ckpt, checkpoint_every)
    bar.close()

    meta = {**provenance(dev, path), "seed": config.seed, "config_key": config.key(),
            "resumed_from_round": first_round,
            "duration_s": time.time() - start + elapsed_before,
            "train_samples": int(len(exp.data.y_train)), "test_samples": int(len(exp.data.y_test)),
            "client_sizes": [len(p) for p in exp.parts]}
    result = Result(config, history, meta)
    atomic_torch_save(tmap(lambda p: p.cpu(), exp.gparams), model_path(config, root))
    result.save(out)
    ckpt.unlink(missing_ok=True)
    _log_run(result, cached=False)
    return result


def _log_run(result: Result, cached: bool) -> None:
    """Append one line per run to ``$FEDLIB_RUN_LOG`` when it is set (``fedlib.notebooks`` sets
    it per notebook, to report what each page costs to compute from scratch)."""
    path = os.environ.get("FEDLIB_RUN_LOG")
    if not path:
        return
    line = {"key": result.config.key(), "algorithm": result.config.algorithm, "cached": cached,
            "duration_s": result.meta.get("duration_s"), "device": result.meta.get("device"),
            "engine": result.meta.get("engine")}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def load_model(result: Result, root: Path | None = None) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The final global model of a finished run."""
    params = torch.load(model_path(result.config, root), weights_only=True)
    model = build_model(result.config.model, dropout=result.config.dropout,
                        proj_dim=projection_dim(result.config))
    model.load_state_dict(params, strict=False)
    return model, params
