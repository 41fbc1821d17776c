"""What the three studies share: profiles, seeds, and runs over seeds with their summaries.

A *profile* says how far a paper's setting is scaled down to fit a machine; each study gives
one :class:`Scale` per profile (its own sizes: MOON-DPAP shrinks data and rounds, FDL also
swaps the CNN for an MLP at ``quick``, DP-FL keeps 1,000 clients), and this module applies it:

* ``smoke``: seconds, for the tests; no verdict is evidence at this profile;
* ``quick``: the default of ``make book`` on a 2-core CPU, reduced data and rounds;
* ``paper``: the papers' own settings (DP-FL: our federation's full profile; the article runs no
  experiment), trained by the campaign (``python -m lab.campaign``) on a GPU or, claims first, on the CPU.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedlib.config import Config, ConfigError
from fedlib.results import REPO_ROOT, Result, load_cached, result_path, results_dir
from fedlib.run import run_many

PROFILES = ("smoke", "quick", "paper")


@dataclass(frozen=True)
class Scale:
    """How one study runs at one profile: fields set (``overrides``), fields capped at a value
    (``caps``: the paper's value unless larger), and the number of seeds."""

    description: str
    seeds: int
    overrides: Mapping[str, Any] = field(default_factory=dict)
    caps: Mapping[str, Any] = field(default_factory=dict)
    #: Whether the paper reports numbers for this setting (False for the DP-FL article, which runs no
    #: experiment: its ``paper`` profile is the full profile of our own federation).
    comparable: bool = True

    def apply(self, config: Config, profile: str) -> Config:
        capped = {k: min(getattr(config, k), v) for k, v in self.caps.items()}
        return config.replace(**self.overrides, **capped, profile=profile)


def scale_of(scales: Mapping[str, Scale], profile: str) -> Scale:
    """The study's :class:`Scale` for ``profile`` (a clear error for an unknown one)."""
    if profile not in scales:
        raise ConfigError(f"unknown profile {profile!r}; choose from {list(scales)}")
    return scales[profile]


def seeds_for(scales: Mapping[str, Scale], profile: str, seeds: int | None = None) -> list[int]:
    """Seeds 0..n-1, n = ``seeds`` or the profile's default."""
    return list(range(seeds if seeds is not None else scale_of(scales, profile).seeds))


# ---- notebook parameters ----------------------------------------------------------------------------
class ParameterError(ValueError):
    """A notebook parameter that cannot be used (one line says which and why)."""


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _count(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


#: Every notebook parameter's rule: name -> (test, what it must be).
PARAMETER_RULES = {
    "profile": (lambda v: v in PROFILES, f"one of {', '.join(PROFILES)}"),
    "n_seeds": (lambda v: v is None or _count(v, 1), "None or an integer >= 1"),
    "flower_seeds": (lambda v: v is None or _count(v, 1), "None or an integer >= 1"),
    "images": (lambda v: v is None or _count(v, 1), "None or an integer >= 1"),
    "seed": (lambda v: _count(v, 0), "an integer >= 0"),
    "timed_rounds": (lambda v: _count(v, 1), "an integer >= 1"),
    "max_rounds": (lambda v: _count(v, 1), "an integer >= 1"),
    "engine": (lambda v: v in ("auto", "sequential", "parallel", "vectorized"),
               "auto, sequential, parallel or vectorized"),
    **{name: (_positive, "a finite number > 0")
       for name in ("epsilon", "eps0", "eps_round", "clip", "clip_epsilon")},
    **{name: (lambda v: _positive(v) and v < 1, "a number in (0, 1)")
       for name in ("delta_round", "total_delta")},
    **{name: (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_positive(x) for x in v),
              "a non-empty list of finite numbers > 0")
       for name in ("alphas", "epsilons", "record_epsilons", "clips")},
}


#: Names an IPython kernel defines itself, with what each holds there: a parameter injected under one of
#: these names (``papermill -p open 1``) replaces it with something else, and is refused (issue 78).
_KERNEL_NAMES = {"In": list, "Out": dict, "get_ipython": callable, "exit": callable, "quit": callable,
                 "open": callable}
#: The underscore names IPython's output caching and namespace define (``_``, ``__``, ``_i``, ``_ii``,
#: ``_i3``, ``_3``, ``_dh``, ``_oh``, ``_ih``, ``_exit_code``, dunders); any other underscore name holding
#: data came from a parameters cell.
_KERNEL_UNDERSCORE = re.compile(r"_{1,3}|_i{1,3}|_i?\d+|_(dh|oh|ih|exit_code)|__\w+__")


def _kernel_owns(name: str, value) -> bool:
    """Whether ``name`` is the kernel's own, holding what the kernel put there."""
    if name in _KERNEL_NAMES:
        kind = _KERNEL_NAMES[name]
        return callable(value) if kind is callable else isinstance(value, kind)
    return bool(_KERNEL_UNDERSCORE.fullmatch(name))


def _undeclared(params: dict, caller: dict) -> list[str]:
    """Data values defined in a notebook kernel's namespace (``caller``) that are not ``params``:
    what papermill injected beyond the declared parameters (a kernel name replaced by a value
    included). Empty outside a kernel."""
    if "get_ipython" not in caller:
        return []
    return sorted(name for name, value in caller.items()
                  if name not in params and not _kernel_owns(name, value)
                  and not (inspect.ismodule(value) or (callable(value) and name not in _KERNEL_NAMES)))


def check_parameters(**params) -> None:
    """Raise :class:`ParameterError` (one line) for the first parameter that breaks its rule
    (:data:`PARAMETER_RULES`) or that no notebook knows. Each notebook calls it right after its
    parameters cell, before any work; ``lab.notebooks`` calls it before executing one.

    Called from a notebook, it also refuses a name that papermill injected but the notebook does
    not declare (``papermill ... -p nosuch 1``, or a misspelt parameter, which papermill only warns
    about): every data value the kernel holds at that point came from the parameters cells, so one
    that is not among ``params`` is unknown to this notebook."""
    unknown = _undeclared(params, inspect.currentframe().f_back.f_globals)
    if unknown:
        raise ParameterError(f"this notebook has no parameter(s) {', '.join(unknown)}; its parameters: "
                             f"{', '.join(params)}")
    for name, value in params.items():
        if name not in PARAMETER_RULES:
            raise ParameterError(f"unknown parameter {name!r}; known: {', '.join(sorted(PARAMETER_RULES))}")
        test, what = PARAMETER_RULES[name]
        if not test(value):
            raise ParameterError(f"parameter {name} must be {what}, got {value!r}")


# ---- runs over seeds -------------------------------------------------------------------------------
ConfigSet = dict[Hashable, list[Config]]


@dataclass(frozen=True)
class Needs:
    """A ledger claim that a page tests (its text as the page records it) and the labels of the
    page's runs (keys of its :data:`ConfigSet`, every seed of each) that decide it. The campaign
    (:mod:`lab.campaign`) trains the runs that settle the most claims first; ``deciding`` claims (an
    open issue names their runs as deciding a verdict: issue 63's readings and controls) before any
    other."""

    claim: str
    labels: tuple[Hashable, ...]
    deciding: bool = False
    #: The runs of some labels can refute the claim on their own ("X is the best of six": one method
    #: ahead of X decides it): a larger profile's runs grade it once two labels are complete there,
    #: when they refute it (:func:`studies.settled.settled_beyond`).
    refutable: bool = False
    #: Runs the claim's grading uses when they are complete (a control, the grid that tunes a setting),
    #: which the campaign trains with the claim (first, when it is deciding) but which the claim does not
    #: wait for: it is graded at a larger profile once ``labels`` are complete there.
    optional: tuple[Hashable, ...] = ()


@dataclass
class Runs:
    """Results of labelled configs, one list per label (one result per seed, in seed order)."""

    results: dict[Hashable, list[Result]]

    def all(self) -> list[Result]:
        return [r for rs in self.results.values() for r in rs]

    def finals(self) -> pd.DataFrame:
        """One row per run: label, seed, final accuracy (%) and loss, and what else it recorded."""
        rows = []
        for label, rs in self.results.items():
            for r in rs:
                f = r.final
                rows.append(
                    {
                        "label": label,
                        "seed": r.config.seed,
                        "acc": 100 * f["test_acc"],
                        "loss": f["test_loss"],
                        **{k: f[k] for k in ("epsilon_spent", "personal_acc", "sparsity") if k in f},
                    }
                )
        return pd.DataFrame(rows)

    def by_seed(self, label: Hashable, metric: str = "acc") -> np.ndarray:
        """``metric`` of ``label``'s runs in seed order (for paired comparisons across seeds)."""
        df = self.finals()
        mine = df[[lab == label for lab in df["label"]]]
        return mine.sort_values("seed")[metric].to_numpy(dtype=float)

    def summary(self) -> pd.DataFrame:
        df = self.finals()
        g = df.groupby("label", sort=False)
        return pd.DataFrame(
            {
                "acc_mean": g["acc"].mean(),
                "acc_std": g["acc"].std(ddof=1).fillna(0.0),
                "loss_mean": g["loss"].mean(),
                "loss_std": g["loss"].std(ddof=1).fillna(0.0),
                "seeds": g["seed"].count(),
            }
        )


# ---- where pages read and write ---------------------------------------------------------------------
def into_book() -> bool:
    """True while the book is built (``FEDLIB_INTO_BOOK=1``, set by ``lab.notebooks``):
    pages then write results, verdicts and audits where the book reads them (``data/``)."""
    return os.environ.get("FEDLIB_INTO_BOOK") == "1"


def scratch_dir() -> Path:
    """``$FEDLIB_SCRATCH_DIR`` or ``data/scratch/`` (git-ignored): where a rerun outside the book
    build writes, so it never changes tracked files."""
    return Path(os.environ.get("FEDLIB_SCRATCH_DIR", REPO_ROOT / "data" / "scratch"))


def write_root() -> Path:
    """Where new results go: the results store during a book build (or when ``FEDLIB_RESULTS_DIR``
    is set explicitly), else scratch."""
    if into_book() or "FEDLIB_RESULTS_DIR" in os.environ:
        return results_dir()
    return scratch_dir() / "results"


def read_roots() -> list[Path]:
    """Where results are looked up first: the store the book reads (committed results)."""
    return [results_dir()]


def with_present_seeds(configs: ConfigSet, roots: list[Path]) -> ConfigSet:
    """``configs`` with every further seed whose results are present for *every* label (seeds n,
    n+1, ... while all labels have one), so that a page uses all the seeds someone trained
    (``campaign run --seeds N``) and its paired comparisons stay paired."""
    if not configs or any(not cs for cs in configs.values()):
        return configs
    out = {label: list(cs) for label, cs in configs.items()}
    seed = max(c.seed for cs in configs.values() for c in cs) + 1
    while True:
        more = {label: cs[-1].replace(seed=seed) for label, cs in out.items()}
        if not all(any(result_path(c, r).exists() for r in roots) for c in more.values()):
            return out
        for label, c in more.items():
            out[label].append(c)
        seed += 1


def forbid_training() -> bool:
    """True when the book is built from committed results only at this page's profile
    (``FEDLIB_FORBID_TRAINING=1``, set by ``lab.notebooks`` for pages rendered at ``paper``):
    a missing result is then an error, never a paper-scale run on the book's machine."""
    return os.environ.get("FEDLIB_FORBID_TRAINING") == "1"


class MissingResults(RuntimeError):
    """A page rendered from committed results only needs a result that is not there."""


def committed_runs(configs: ConfigSet) -> Runs:
    """The results of ``configs`` already written (committed, or trained here), loaded, never trained:
    the labels whose every seed has a result (a page shows what the campaign has trained of a larger
    profile's runs)."""
    roots = [*read_roots(), write_root()]
    found = {label: [load_cached(c, roots) for c in cs] for label, cs in configs.items()}
    return Runs({label: rs for label, rs in found.items() if rs and all(r is not None for r in rs)})


def run_all(configs: ConfigSet, progress: bool = False, engine: str = "auto") -> Runs:
    """Run (or load) every config; the seeds of one label go to the engine as one run batch.
    Committed results are reused (with every further seed present for all labels); new ones go to
    :func:`write_root`."""
    root = write_root()
    cache = [r for r in read_roots() if r != root]
    configs = with_present_seeds(configs, [root, *cache])
    if forbid_training():
        missing = [c for cs in configs.values() for c in cs if load_cached(c, [root, *cache]) is None]
        if missing:
            raise MissingResults(
                f"{len(missing)} result(s) missing at profile {missing[0].profile!r} (first: "
                f"{missing[0].algorithm}-{missing[0].key()}); this page is built from committed results "
                "only: train them with python -m lab.campaign run, or build at another profile")
    return Runs(
        {
            label: run_many(cs, progress=progress, root=root, cache_roots=cache, engine=engine)
            for label, cs in configs.items()
        }
    )


def mean_curve(results: list[Result]) -> pd.DataFrame:
    """Mean and standard deviation over seeds of the per-round test accuracy (%) and loss."""
    frames = [r.frame().dropna(subset=["test_acc"])[["round", "test_acc", "test_loss"]] for r in results]
    df = pd.concat(frames).groupby("round").agg(["mean", "std"])
    df.columns = [f"{a}_{b}" for a, b in df.columns]
    df["acc_mean"] = 100 * df.pop("test_acc_mean")
    df["acc_std"] = 100 * df.pop("test_acc_std").fillna(0.0)
    return df.reset_index()


def fmt(mean: float, std: float, seeds: int, digits: int = 2) -> str:
    """``mean`` or ``mean ± std`` (several seeds)."""
    return f"{mean:.{digits}f}" if seeds < 2 else f"{mean:.{digits}f} ± {std:.{digits}f}"


#: The models as a reader knows them (``Config.model`` -> words).
MODEL_LABELS = {"cnn": "MOON-DPAP's CNN", "mcmahan_cnn": "the CNN of McMahan et al.",
                "mlp": "an MLP (784-100-10)"}

#: Readable headers for the columns the pages compute (see :func:`readable`).
HEADERS = {
    "index": "", "acc_mean": "accuracy (%)", "acc_std": "std (pp)", "loss_mean": "final test loss",
    "loss_std": "loss std",
    "seeds": "seeds", "z": "noise multiplier z", "epsilon": "epsilon",
    "true_eps_round": "true epsilon / round",
    "true_eps_run": "true epsilon / run", "sent_frac": "fraction of coordinates sent",
}


def unnamed_index(df: pd.DataFrame) -> bool:
    """Whether ``df``'s index is only row numbers (no level has a name)."""
    return all(n is None for n in df.index.names)


def readable(df: pd.DataFrame, sig: int = 3, headers: Mapping[str, str] | None = None,
             missing: str = "n/a") -> pd.DataFrame:
    """``df`` for a reader: readable headers (:data:`HEADERS`, then ``headers``) and every column
    written by :func:`studies.numbers.column` (``sig`` significant figures, shared decimals, powers
    of ten, thousands separators); an infinite loss or accuracy shown as "diverged", an infinite
    privacy budget (a column about epsilon) as no guarantee, and missing values as ``missing``; an
    unnamed index dropped (row numbers, also after a concatenation or a filter: issue 79), a named
    one kept as the first column."""
    from studies import numbers

    names = {**HEADERS, **(headers or {})}
    out = df.reset_index(drop=unnamed_index(df))

    def is_inf(v) -> bool:
        return isinstance(v, float | np.floating) and math.isinf(v)

    def cells(column: str, values: list) -> list[str]:
        privacy = "eps" in column.lower()
        diverges = "loss" in column or "acc" in column
        texts = numbers.column(values, sig, privacy=privacy)
        return ["diverged" if diverges and is_inf(v) else missing if t == numbers.MISSING
                else numbers.symbols(t) for v, t in zip(values, texts, strict=True)]

    return pd.DataFrame({numbers.symbols(names.get(str(c), str(c))): cells(str(c), list(out[c]))
                         for c in out.columns})


def table_for_reader(df: pd.DataFrame, sig: int = 3, headers: Mapping[str, str] | None = None,
                     code: Sequence[str] = ()):
    """:func:`readable` as a styled table without the row numbers (what a page shows); a name from
    the code (a config key, a notebook), a whole cell or within its text, is set as code, and so is
    every cell of the columns named in ``code`` (their values verbatim: parameter names, whose Greek
    letters are not maths)."""
    from html import escape

    from studies.numbers import IDENTIFIER, code_names

    def cell(v) -> str:
        if not isinstance(v, str):
            return v
        return f"<code>{escape(v)}</code>" if IDENTIFIER.match(v) else code_names(v)

    shown = readable(df, sig, headers)
    raw = df.reset_index(drop=unnamed_index(df))
    for column in code:
        shown[shown.columns[list(raw.columns).index(column)]] = [f"<code>{escape(str(v))}</code>"
                                                                   for v in raw[column]]
    return shown.style.hide(axis="index").format(lambda v: v if str(v).startswith("<code>") else cell(v))


def untrained_accuracy(config: Config) -> float:
    """Test accuracy (%) of the initial global model of ``config`` (round 0): the level a method
    that learns nothing stays at, which for a random model can lie below chance."""
    import torch

    from fedlib.experiment import Experiment

    return 100 * Experiment(config, torch.device("cpu")).evaluate()["test_acc"]


def runs_description(configs) -> str:
    """What a page's runs were, from their configurations (or results): clients, training images,
    rounds, model and seeds, each as a value or a range (e.g. "20 clients, 500 training images, 30
    rounds, an MLP (784-100-10), 5 seeds")."""
    from fedlib.data import TRAIN_SIZE

    cs = [getattr(c, "config", c) for c in configs]
    if not cs:
        return ""

    def span(values, unit: str) -> str:
        vs = sorted(set(values))
        return f"{vs[0]:,} {unit}" if len(vs) == 1 else f"{vs[0]:,} to {vs[-1]:,} {unit}"

    models = " and ".join(sorted({MODEL_LABELS.get(c.model, c.model) for c in cs}))
    seeds = len({c.seed for c in cs})
    return ", ".join([span([c.clients for c in cs], "clients"),
                      span([c.train_samples or TRAIN_SIZE for c in cs], "training images"),
                      span([c.rounds for c in cs], "rounds"), models,
                      f"{seeds} seed{'s' if seeds != 1 else ''}"])


def profile_note(scales: Mapping[str, Scale], profile: str, results: list[Result] | None = None,
                 what: str | None = None) -> str:
    """A sentence (Markdown) saying which profile a page's numbers come from, what that means, and
    what this page itself ran: ``what`` if given (an attack, a timing), else the runs of
    ``results`` (:func:`runs_description`), so that the line is true to the page."""
    scale = scale_of(scales, profile)
    devices = sorted({str(r.meta.get("device", "?")).split(" (")[0] for r in results or []})
    where = f", computed on {', '.join(devices)}" if devices else ""
    ran = what or runs_description(results or [])
    ran = f" This page ran {ran}." if ran else ""
    if profile == "paper":
        compare = ("These numbers are comparable to the paper's." if scale.comparable else
                   "The article runs no experiment to compare with: this is the full profile of our own "
                   "federation.")
        return f"**Profile `paper`**: {scale.description}{where}.{ran} {compare}"
    return (
        f"**Profile `{profile}`**: {scale.description}{where}.{ran} Absolute numbers are not comparable "
        "to the paper's; orderings and directions are tested across seeds."
    )


def no_training_note(profile: str, why: str) -> str:
    """The profile line of a page that trains nothing (its numbers come from formulas or analysis)."""
    return f"**Profile `{profile}`** changes nothing on this page: {why}."
