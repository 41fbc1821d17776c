"""Small helpers for parameter trees (dicts of tensors, possibly nested)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

Tree = Any


def tmap(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """Apply ``fn`` leafwise over one or more trees of the same structure."""
    return pytree.tree_map(fn, tree, *rest)


def leaves(tree: Tree) -> list[torch.Tensor]:
    return pytree.tree_leaves(tree)


def stack(trees: list[Tree]) -> Tree:
    """List of trees -> one tree with a leading client dimension."""
    return tmap(lambda *xs: torch.stack(xs), *trees)


def unstack(tree: Tree, n: int) -> list[Tree]:
    return [tmap(lambda x, i=i: x[i], tree) for i in range(n)]


def index(tree: Tree, idx: torch.Tensor | int) -> Tree:
    return tmap(lambda x: x[idx], tree)


def where(mask: torch.Tensor, new: Tree, old: Tree) -> Tree:
    """Per-client select: ``mask`` has shape (C,), leaves have a leading C dimension."""
    return tmap(lambda n, o: torch.where(mask.view((-1,) + (1,) * (n.dim() - 1)), n, o), new, old)


def sq_norm(tree: Tree) -> torch.Tensor:
    """Squared L2 norm over all leaves (flattened), for a single (unstacked) tree."""
    return sum((x.float() ** 2).sum() for x in leaves(tree))


def numel(tree: Tree) -> int:
    return sum(x.numel() for x in leaves(tree))


def flatten_stacked(tree: dict[str, torch.Tensor]) -> torch.Tensor:
    """A dict of stacked leaves ``(m, ...)`` -> one ``(m, d)`` matrix (leaves in key order)."""
    return torch.cat([tree[k].reshape(tree[k].shape[0], -1) for k in tree], dim=1)


def unflatten_like(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten_stacked` for one (unstacked) vector ``flat`` of length d."""
    out, i = {}, 0
    for k, v in like.items():
        out[k] = flat[i:i + v.numel()].reshape(v.shape).to(v.dtype)
        i += v.numel()
    return out
