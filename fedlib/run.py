"""Training configs to results: :func:`run` and :func:`run_many`.

:func:`run` validates the config before any work, loads a cached result when the same config was
run before (unless ``force``), trains its rounds (:class:`fedlib.experiment.Experiment`),
checkpoints every few rounds so that an interrupted run resumes where it stopped with the same
final result (:class:`Trainee`), and writes the result atomically. :func:`run_many` trains several
runs of one shape together (a run batch, :class:`fedlib.experiment.RunBatch`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from fedlib import data as data_mod
from fedlib.config import Config
from fedlib.engine import PATHS, check_path, default_path
from fedlib.experiment import Experiment, RunBatch, projection_dim
from fedlib.kernels import make_deterministic
from fedlib.models import build_model
from fedlib.privacy.guarantee import classify_meta, is_released
from fedlib.results import (
    ConfigLocks,
    Result,
    atomic_torch_save,
    check_writable,
    checkpoint_dir,
    checkpoint_path,
    code_commit,
    collapse,
    diverged,
    load_cached,
    model_path,
    provenance,
    result_path,
    results_dir,
    run_seconds,
    set_aside,
)
from fedlib.tree import leaves, tmap


class DeviceError(ValueError):
    """A device that does not exist here; raised before any work starts."""


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """``auto``/None: CUDA when available, else the CPU. On CUDA, also
    :func:`fedlib.kernels.make_deterministic`. A device that does not exist (an unknown name,
    ``cuda`` on a machine without a GPU, ``cuda:3`` on one with two) is a :class:`DeviceError`
    naming what this machine has."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.type == "cuda" and (n == 0 or (dev.index or 0) >= n):
        found = "no CUDA GPU" if n == 0 else f"{n} CUDA GPU(s): cuda:0..cuda:{n - 1}"
        raise DeviceError(f"device {device!r} is not available: this machine has {found}")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {device!r} is not supported; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda":
        make_deterministic()
    return dev


def _validate_engine(engine: str, device: torch.device, checkpoint_every: int) -> str:
    """The engine path to use, or a clear error before any work starts."""
    if engine != "auto" and engine not in PATHS:
        raise ValueError(f"unknown engine {engine!r}; choose from {('auto', *PATHS)}")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    path = default_path(device) if engine == "auto" else engine
    check_path(path, device)
    return path


def _leaves(tree, prefix: str = "") -> list[tuple[str, object]]:
    """(path, leaf) of a nested dict/list state, in a fixed order."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree, key=str) for x in _leaves(tree[k], f"{prefix}/{k}")]
    if isinstance(tree, (list, tuple)):
        return [x for i, v in enumerate(tree) for x in _leaves(v, f"{prefix}/{i}")]
    return [(prefix, tree)]


def state_digest(state: dict) -> str:
    """SHA-256 of a training state: every tensor's path, dtype, shape and bytes, and every other
    value's path and repr, in a fixed order. A checkpoint carries it; a resume recomputes it, so a
    tensor changed in place (same shape) is caught, not trained on."""
    import hashlib

    h = hashlib.sha256()
    for path, leaf in _leaves(state):
        h.update(path.encode())
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def state_layout_problem(saved: dict, fresh: dict) -> str | None:
    """Why a saved training state cannot be the state of this run (a missing or extra entry, a tensor
    of another shape or dtype), or None: compared with the state a fresh start of the run has."""
    a, b = dict(_leaves(saved)), dict(_leaves(fresh))
    if a.keys() != b.keys():
        missing, extra = sorted(b.keys() - a.keys()), sorted(a.keys() - b.keys())
        return f"entries differ (missing {missing[:3]}, unexpected {extra[:3]})"
    for path, x in b.items():
        y = a[path]
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return f"{path} is not a tensor"
        if isinstance(x, torch.Tensor) and (x.shape != y.shape or x.dtype != y.dtype):
            return f"{path} is {y.dtype} {tuple(y.shape)}, the run needs {x.dtype} {tuple(x.shape)}"
    return None


class Trainee:
    """One run being trained (alone or in a run batch): its experiment, history, checkpoint."""

    def __init__(self, config: Config, dev: torch.device, root: Path, force: bool, path: str | None = None):
        self.config = config
        self.exp = Experiment(config, dev)
        self.history: list[dict] = []
        self.first_round = 0
        #: Report personalised accuracy at the last round (False where the personal models live
        #: elsewhere, e.g. on Flower clients).
        self.personal = True
        #: The code commit that wrote the checkpoint this run resumed from (None: not resumed).
        self.resumed_commit: str | None = None
        #: The engine path that trained the rounds before the checkpoint (None: not resumed, or a
        #: checkpoint written before 2026-11-26, which did not record it).
        self.resumed_engine: str | None = None
        #: The engine path training this run now (written into its checkpoints).
        self.path = path
        #: The stretches of rounds trained before this run's checkpoint, oldest first, each
        #: ``{"from_round", "to_round", "commit", "engine"}`` (:meth:`trained_in`); empty: not resumed.
        self.earlier: list[dict] = []
        self.ckpt = checkpoint_path(config, root)
        self.out = result_path(config, root)
        if self.ckpt.exists() and not force:
            self._resume(dev)

    def _resume(self, dev: torch.device) -> None:
        """Continue from the checkpoint: tensors and plain data only (``weights_only=True``: a file
        that would run code when unpickled is refused), of this config, with the layout of this run's
        state and the digest it was written with (:func:`state_digest`; checkpoints written before
        digests existed are checked for their layout only). A checkpoint that does not load or verify
        (truncated, another config's, a tensor changed, missing or of another shape) is set aside
        with one line and the run starts from round 0."""
        try:
            saved = torch.load(self.ckpt, map_location=dev, weights_only=True)
            if saved.get("config_key") != self.config.key():
                raise ValueError("it belongs to another config")
            problem = state_layout_problem(saved["state"], self.exp.state_dict())
            if problem:
                raise ValueError(f"its state does not fit this run: {problem}")
            if "digest" in saved and saved["digest"] != state_digest(saved["state"]):
                raise ValueError("its tensors changed after it was written (digest mismatch)")
            self.exp.load_state_dict(saved["state"])
            self.history, self.first_round = list(saved["history"]), int(saved["next_round"])
            self.resumed_commit = saved.get("commit")
            self.resumed_engine = saved.get("engine")
            # checkpoints written before 2026-11-30 name only their last writer, not where it started
            self.earlier = [dict(s) for s in saved.get("trained_in") or
                            [{"from_round": None, "to_round": self.first_round,
                              "commit": self.resumed_commit, "engine": self.resumed_engine}]]
        except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: start again, keep the file
            self.exp = Experiment(self.config, dev)
            self.history, self.first_round, self.earlier = [], 0, []
            self.resumed_commit = self.resumed_engine = None
            first = (str(e).splitlines() or [""])[0][:120]
            set_aside(self.ckpt, f"checkpoint not loaded: {type(e).__name__}: {first}")

    def after_round(self, t: int, rec: dict, wall_s: float, checkpoint_every: int) -> dict:
        """Record round ``t`` (and evaluate when due), checkpointing every ``checkpoint_every`` rounds."""
        config, exp = self.config, self.exp
        rec = {"round": t + 1, **rec, "wall_s": wall_s}
        if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds_run:
            t1 = time.time()
            rec.update(exp.evaluate())
            if t + 1 == config.rounds_run and self.personal:
                rec.update(exp.personal_accuracy())
            rec["eval_s"] = time.time() - t1
        else:
            rec["test_acc"] = rec["test_loss"] = None
        self.history.append(rec)
        if (t + 1) % checkpoint_every == 0 and t + 1 < config.rounds_run:
            self.checkpoint(t + 1)
        return rec

    def trained_in(self, to_round: int) -> list[dict]:
        """Which code trained which rounds, up to ``to_round``: the stretches before this run's
        checkpoint and this process's, from its first round (``from_round`` inclusive, ``to_round``
        exclusive, 0-based; a stretch from a checkpoint that did not record its start has
        ``from_round`` None)."""
        return [*self.earlier, {"from_round": self.first_round, "to_round": to_round,
                                "commit": code_commit(), "engine": self.path}]

    def checkpoint(self, next_round: int) -> None:
        """Save the state to resume from round ``next_round`` (atomically, with a digest of its tensors
        and the stretches of rounds each commit trained, :meth:`trained_in`)."""
        state = self.exp.state_dict()
        atomic_torch_save({"state": state, "digest": state_digest(state), "history": self.history,
                           "next_round": next_round, "config_key": self.config.key(), "commit": code_commit(),
                           "engine": self.path, "trained_in": self.trained_in(next_round)}, self.ckpt)

    def save(self, dev: torch.device, path: str, start: float, root: Path, extra: dict) -> Result:
        """Write the finished run's result (history, provenance, privacy statement) and its model; the
        checkpoint goes. A failed result write removes the model file too."""
        exp, config = self.exp, self.config
        elapsed_before = sum(h["wall_s"] for h in self.history[:self.first_round])
        meta = {**provenance(dev, path), "seed": config.seed, "config_key": config.key(),
                "resumed_from_round": self.first_round,
                **({"resumed_from_commit": self.resumed_commit} if self.first_round else {}),
                # the paths may round differently: a run resumed on another path says which trained first
                **({"resumed_from_engine": self.resumed_engine} if self.first_round and self.resumed_engine
                   else {}),
                # a resumed run's whole chain: which commit and engine trained which rounds
                **({"trained_in": self.trained_in(config.rounds_run)} if self.first_round else {}),
                "duration_s": time.time() - start + elapsed_before,
                "train_samples": int(len(exp.data.y_train)), "test_samples": int(len(exp.data.y_test)),
                "client_sizes": [len(p) for p in exp.parts], "diverged": diverged(self.history),
                "collapse": collapse(self.history),
                "data_sha256": data_mod.dataset_digest(config.dataset),
                "reproducible": config.randomness != "secret", **extra}
        if exp.guarantee is not None:
            metrics = sorted({k for h in self.history for k in h})
            meta["privacy"] = {**exp.guarantee.to_dict(),
                               "statement": exp.guarantee.describe(self.history[-1].get("epsilon_spent")),
                               "released_metrics": [k for k in metrics if is_released(k)],
                               "diagnostic_metrics": [k for k in metrics if not is_released(k)],
                               **exp.algo.privacy_details()}
            meta["privacy"].update(classify_meta({**meta, "content_sha256": ""}))
        result = Result(config, self.history, meta)
        model = model_path(config, root)
        atomic_torch_save(tmap(lambda p: p.cpu(), exp.gparams), model)
        try:
            result.save(self.out)
        except BaseException:  # no model file without its result (the checkpoint stays for a rerun)
            model.unlink(missing_ok=True)
            raise
        self.ckpt.unlink(missing_ok=True)
        _log_run(result, cached=False)
        return result


def run(config: Config, *, engine: str = "auto", device: str | torch.device | None = None,
        force: bool = False, root: Path | None = None, checkpoint_every: int = 5,
        progress: bool = True) -> Result:
    """Run ``config`` (or load it from the cache) and return its :class:`~fedlib.results.Result`.

    ``engine``: ``auto`` (vectorized on a GPU; on a CPU parallel worker processes when
    there are two or more cores, else sequential), ``sequential``, ``parallel`` or
    ``vectorized``; the choice does not change the result beyond float rounding.
    """
    return run_many([config], engine=engine, device=device, force=force, root=root,
                    checkpoint_every=checkpoint_every, progress=progress)[0]


def run_many(configs: list[Config], *, engine: str = "auto", device: str | torch.device | None = None,
             force: bool = False, root: Path | None = None, checkpoint_every: int = 5,
             progress: bool = True, cache_roots: list[Path] | None = None,
             deadline: float | None = None, locked: str = "wait") -> list[Result | None]:
    """Run several configs (or load them from the cache), training the missing ones together.

    The configs still to train must form one *run batch* (see :func:`batch_key`: the same
    algorithm, model and client-side settings; seeds, data, schedules and server-side
    settings may differ). On the vectorized path their clients are stacked in one group;
    on the others the runs take turns each round. Each run writes its own result file,
    the same as training it alone (up to float rounding: tested). ``cache_roots``: further
    results folders where an existing result is loaded from instead of training (``root`` first).
    ``deadline`` (a ``time.time()`` value): past it, the runs still training checkpoint at the end
    of the current round and stop; their entries are None and a later call resumes them.
    A run that another process is training (its lock, :class:`fedlib.results.ConfigLocks`) is
    waited for and then loaded (``locked="wait"``), or left to it (``"skip"``: its entry is None).
    """
    if locked not in ("wait", "skip"):
        raise ValueError(f"locked must be wait or skip, got {locked!r}")
    for c in configs:
        c.validate()
    code_commit()  # the commit of the code this process runs, fixed before any training
    dev = pick_device(device)
    path = _validate_engine(engine, dev, checkpoint_every)
    root = Path(root or results_dir())
    data_mod.data_dir()  # an empty FEDLIB_DATA_DIR is refused before any folder is made
    results: dict[int, Result] = {}
    todo: list[int] = []
    for i, c in enumerate(configs):
        cached = None if force else load_cached(c, [root, *(cache_roots or [])])
        if cached is not None:
            results[i] = cached
            _log_run(results[i], cached=True)
        elif c.key() not in {configs[j].key() for j in todo}:
            todo.append(i)
    if todo:
        check_batch([configs[i] for i in todo])
        # before the first lock is taken: every folder the runs write, with room for a start
        check_writable([root, root / "locks", root / "models", checkpoint_dir(root)])
        locks = ConfigLocks(root)
        try:
            mine = []
            for i in sorted(todo, key=lambda i: configs[i].key()):  # one order: no two waiters deadlock
                if not locks.acquire(configs[i], block=locked == "wait"):
                    continue  # another process trains it ("skip"): this call returns None for it
                done = None if force else load_cached(configs[i], [root])  # it may have just finished
                if done is not None:
                    results[i] = done
                else:
                    mine.append(i)
            mine.sort()
            if mine:
                trained = _train_batch([configs[i] for i in mine], dev, path, root, force, checkpoint_every,
                                       progress, deadline)
                results.update(zip(mine, trained, strict=True))
        finally:
            locks.release_all()
    out = []
    for i, c in enumerate(configs):
        if i in results:
            out.append(results[i])
        else:  # a duplicate of a config trained above
            out.append(load_cached(c, [root]))
    return out


#: Config fields that may differ between the runs of one run batch: they act on the data and
#: its partition, on the host (sampling, privacy mechanisms, the server step), or on the
#: clients only through ``Algorithm.hyper`` (stacked per lane when they differ).
BATCHABLE_FIELDS = frozenset({
    "seed", "profile", "eval_every", "test_samples", "train_samples", "clients", "client_fraction",
    "partition", "alpha", "min_client_samples", "shards_per_client", "server_lr",
    "lr", "cosine_lr", "lr_min", "moon_mu", "moon_tau", "tau_min", "mu_max", "schedule_ramp",
    "prune_t_min", "prune_t_max", "dp_epsilon_per_round", "dp_epsilon_total", "dp_delta", "dp_schedule",
    "dp_eps_floor",
    "dp_noise_multiplier", "clip_quantile", "clip_lr", "clip_count_std",
    "ldp_fl_epsilon_per_coordinate", "signds_epsilon_per_round", "fdl_epsilon_per_draw",
    "fdl_epsilon_per_round",
    "ldp_clip", "fdl_r", "fdl_th", "fdl_k", "fdl_selection_share",
    "signds_k", "signds_h", "signds_threshold", "signds_lr",
})


def batch_key(config: Config) -> str:
    """Runs with equal keys can be trained together in one run batch (same rounds too)."""
    d = {k: v for k, v in config.to_dict().items() if k not in BATCHABLE_FIELDS}
    return json.dumps(d, sort_keys=True)


def check_batch(configs: list[Config]) -> None:
    """Refuse configs that cannot train as one run batch (:func:`batch_key`), naming the fields that
    differ."""
    keys = {batch_key(c) for c in configs}
    if len(keys) > 1:
        first = json.loads(next(iter(keys)))
        differ = sorted({k for key in keys for k, v in json.loads(key).items() if first.get(k) != v})
        raise ValueError(f"these configs cannot be trained in one run batch: they differ in {differ} "
                         "(client-side settings); group them with fedlib.run.batch_key")


def _train_batch(configs: list[Config], dev: torch.device, path: str, root: Path, force: bool,
                 checkpoint_every: int, progress: bool, deadline: float | None = None) -> list[Result | None]:
    start = time.time()
    runs = [Trainee(c, dev, root, force, path) for c in configs]
    if len({r.first_round for r in runs}) > 1:  # checkpoints of unequal age: start all afresh
        runs = [Trainee(c, dev, root, True, path) for c in configs]
    # before the first round: every folder a run writes is writable and holds what it will write
    state_bytes = sum(t.numel() * t.element_size() for r in runs for t in leaves(r.exp.state_dict())
                      if isinstance(t, torch.Tensor))
    check_writable([root, root / "models", checkpoint_dir(root)],
                   need_bytes=2 * state_bytes + 2**20 * len(runs))
    first, total = runs[0].first_round, configs[0].rounds_run
    batch = RunBatch([r.exp for r in runs])
    label = configs[0].algorithm + (f" x{len(runs)}" if len(runs) > 1 else "")
    bar = tqdm(range(first, total), desc=f"{label} ({path}, {dev.type})", unit="round",
               disable=not progress, initial=first, total=total)
    with batch.executor(path) as executor:
        for t in bar:
            t0 = time.time()
            recs = batch.round(t, executor)
            wall = (time.time() - t0) / len(runs)
            for r, rec in zip(runs, recs, strict=True):
                done = r.after_round(t, rec, wall, checkpoint_every)
            if done.get("test_acc") is not None:
                bar.set_postfix(acc=f"{done['test_acc']:.4f}", loss=f"{done['test_loss']:.3f}")
            if deadline is not None and time.time() > deadline and t + 1 < total:
                for r in runs:  # stop cleanly: a checkpoint to resume from, no result
                    r.checkpoint(t + 1)
                bar.close()
                return [None] * len(runs)
    bar.close()
    extra = {"run_batch": [c.key() for c in configs]} if len(configs) > 1 else {}
    return [r.save(dev, path, start, root, extra) for r in runs]


def _log_run(result: Result, cached: bool) -> None:
    """Append one line per run to ``$FEDLIB_RUN_LOG`` when it is set (``fedlib.notebooks`` sets
    it per notebook, to report what each page costs to compute from scratch)."""
    path = os.environ.get("FEDLIB_RUN_LOG")
    if not path:
        return
    line = {"key": result.config.key(), "algorithm": result.config.algorithm, "cached": cached,
            "duration_s": run_seconds(result.meta), "device": result.meta.get("device"),
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
