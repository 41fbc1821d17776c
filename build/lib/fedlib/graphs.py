"""The vectorized path's local step captured once per round and replayed (CUDA graphs).

On a GPU the vmapped step of a small CNN is launch-bound: ``make bench`` on an H100 measured about
14 ms a step whatever the number of lanes, most of it Python and kernel launches, not arithmetic
(issue 24). A CUDA graph records the step's kernels once and replays them with one launch
(PyTorch's "whole-network capture": https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
Replayed on an H200, a round of one run took 0.087 s and a batch of 8 runs 4.7 times that: the
launches no longer bound the step, its kernels' speed on the small per-lane operations does
(``lab.bench.batch_round_cost``; the book's benchmark page).
A graph reads and writes fixed addresses, so :class:`CapturedStep` keeps everything the step reads
in its own buffers: the lanes' local state, this step's minibatch selection (sample indices,
padding weights, dropout masks, DP-SGD noise, which lanes are active) and the lanes' client states
and run contexts; one replay computes

    state <- where(active, client_step(state, batch(x, y, selection), cstate, context), state)

in place, the same operations in the same order as the eager loop of
:func:`fedlib.engine.run_vectorized` (the GPU replays the kernels it recorded from them), so a replay
computes the eager step's function: checked bit for bit on a CPU here (tests/test_graphs.py) and
against the CPU reference on a GPU (tests/test_cuda.py). What a graph cannot see, the capture must
not depend on: everything the step reads changes only through :meth:`CapturedStep.load` and
:meth:`CapturedStep.set_state`, and the round's Python values (the round number, hyperparameters
shared by every run) are fixed for one round, which is why the engine captures once per round.

``backend`` does the recording: :class:`CudaGraphs` on a GPU; :class:`EagerReplay` on a CPU, which
re-runs the recorded function at each replay, so that the buffer handling (what is loaded when,
the in-place update, the warm-up that must leave no trace) is tested on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol

import torch

from fedlib.kernels import cuda_graphs_enabled
from fedlib.tree import Tree, leaves, tmap, where

#: Eager steps run before the first capture of a step (on a side stream on CUDA): they make the
#: libraries initialise lazily what the step uses (handles, workspaces, kernel modules) outside
#: the graph, PyTorch's documented warm-up.
WARMUP_STEPS = 2

#: What this process has warmed up: (the caller's tag, the shapes of everything the step reads).
#: A later capture of the same step (the next round of the same run) needs no warm-up: the
#: libraries have initialised what it uses, and a warm-up costs two eager steps a round.
_WARMED: set[tuple] = set()


def signature(*trees: Tree) -> tuple:
    """Shapes, dtypes and devices of every leaf (what a library initialises lazily depends on)."""
    return tuple((tuple(x.shape), x.dtype, str(x.device)) for x in leaves(list(trees)))


class Replayable(Protocol):
    def replay(self) -> None: ...


class CaptureBackend(Protocol):
    def warmup(self, fn: Callable[[], None], steps: int) -> None: ...

    def capture(self, fn: Callable[[], None]) -> Replayable: ...


class CudaGraphs:
    """Record ``fn`` as a ``torch.cuda.CUDAGraph`` after warming it up on a side stream."""

    def warmup(self, fn: Callable[[], None], steps: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(steps):
                fn()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, fn: Callable[[], None]) -> Replayable:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph


class EagerReplay:
    """The CPU stand-in of :class:`CudaGraphs`: a replay calls the recorded function again."""

    class _Recorded:
        def __init__(self, fn: Callable[[], None]):
            self.fn = fn

        def replay(self) -> None:
            self.fn()

    def warmup(self, fn: Callable[[], None], steps: int) -> None:
        for _ in range(steps):
            fn()

    def capture(self, fn: Callable[[], None]) -> Replayable:
        return self._Recorded(fn)


def capture_backend(device: torch.device) -> CaptureBackend | None:
    """How the vectorized path on ``device`` captures its step: CUDA graphs on a GPU when the
    ``cuda_graphs`` option is on (:func:`fedlib.kernels.set_kernel_options`), else None (eager)."""
    return CudaGraphs() if device.type == "cuda" and cuda_graphs_enabled() else None


def copy_into(dst: Tree, src: Tree) -> None:
    """Copy every leaf of ``src`` into the same leaf of ``dst`` (one fused launch for the lot;
    a leaf that already is its destination is left alone)."""
    d, s = leaves(dst), leaves(src)
    if len(d) != len(s):
        raise ValueError(f"trees differ: {len(d)} leaves to fill from {len(s)}")
    pairs = [(a, b) for a, b in zip(d, s, strict=True) if a is not b]
    if pairs:
        torch._foreach_copy_([a for a, _ in pairs], [b for _, b in pairs])


class CapturedStep:
    """``step`` (the engine's vmapped local step) and the batch gather around it, in fixed buffers.

    ``gather(selection)`` builds the minibatch from the selection (the engine's ``_batch`` over
    its training tensors); ``step(state, batch, cstate, context)`` is the vmapped step; the
    selection has an ``active`` mask over lanes. The constructor warms up on copies of the
    arguments (``warmup_steps``; None: :data:`WARMUP_STEPS` the first time this process captures a
    step with this ``tag`` and these shapes, else none), puts the state back, and records one step.
    Then, per step: :meth:`load` the selection (and, when a lane switched clients, the client
    states and contexts), and :meth:`replay`; :attr:`state` holds the lanes' state after it (read
    it, do not keep it across a replay: the next one overwrites it).
    """

    def __init__(self, gather: Callable[[Tree], Tree], step: Callable[[Tree, Tree, Tree, Tree], Tree],
                 state: Tree, selection: Tree, cstate: Tree, context: Tree,
                 backend: CaptureBackend, warmup_steps: int | None = None, tag: Hashable = None):
        if "active" not in selection:
            raise ValueError("the selection needs an 'active' mask over lanes")
        self._gather, self._step = gather, step
        self.state = tmap(torch.clone, state)
        self.inputs = {"selection": tmap(torch.clone, selection), "cstate": tmap(torch.clone, cstate),
                       "context": tmap(torch.clone, context)}
        key = (tag, signature(state, selection, cstate, context))
        if warmup_steps is None:
            warmup_steps = 0 if key in _WARMED else WARMUP_STEPS
        if warmup_steps:
            start = tmap(torch.clone, self.state)
            backend.warmup(self._one_step, warmup_steps)
            copy_into(self.state, start)  # the warm-up steps leave no trace
        self._graph = backend.capture(self._one_step)
        _WARMED.add(key)

    def _one_step(self) -> None:
        sel = self.inputs["selection"]
        new = self._step(self.state, self._gather(sel), self.inputs["cstate"], self.inputs["context"])
        copy_into(self.state, where(sel["active"], new, self.state))

    def load(self, **parts: Tree) -> None:
        """New values for some of ``selection``, ``cstate``, ``context`` (same shapes), in one copy."""
        unknown = set(parts) - set(self.inputs)
        if unknown:
            raise ValueError(f"unknown inputs {sorted(unknown)}; the step reads {sorted(self.inputs)}")
        copy_into([self.inputs[k] for k in parts], list(parts.values()))

    def set_state(self, state: Tree) -> None:
        copy_into(self.state, state)

    def replay(self) -> None:
        self._graph.replay()
