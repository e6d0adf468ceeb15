"""The module a script trains without DDP: found once, from its optimizer's parameters.

A script that syncs its gradients itself (karpathy/nanochat's optimizer reduce-scatters
them; no ``DistributedDataParallel`` module) and draws its batches from no DataLoader (a
generator of token tensors) gives the zero-code hooks neither of their two counts of a
step's samples. Its model is then the one module all of whose forwards train it: the
outermost module (no other module holds it) whose parameters its optimizer steps,
``torch.compile``'s wrapper where the script compiled it (its ``_orig_mod`` is held). A
forward pre-hook on it counts the batches it trains on, as a DDP module's does.

Found by one pass over the objects the garbage collector tracks, at the end of the first
optimizer step of such a script only (every other script counts its samples already): tens of
milliseconds, once. Objects a script froze out of the collector's view (``gc.freeze()``)
before that step are not seen: no module found, no samples counted, as before.
"""

from __future__ import annotations

import gc
from typing import Any


def optimized_ids(optimizer: Any) -> set[int]:
    """The ids of the tensors ``optimizer`` steps (none where its groups are not the usual
    list of dicts of ``params``)."""
    ids: set[int] = set()
    for group in getattr(optimizer, "param_groups", None) or ():
        params = group.get("params") if isinstance(group, dict) else None
        if isinstance(params, list | tuple):
            ids.update(id(p) for p in params)
    return ids


def trained_root(module_type: type, optimizer: Any) -> Any | None:
    """The one outermost ``module_type`` (``torch.nn.Module``) holding a parameter that
    ``optimizer`` steps, or None where there is none or more than one (two models one
    optimizer trains, each called by itself: their samples cannot be told apart)."""
    ids = optimized_ids(optimizer)
    if not ids:
        return None
    # ``type()`` only: an object's ``__class__`` may be a property that raises (a proxy)
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), module_type)]
    held: set[int] = set()
    for module in modules:
        children = getattr(module, "_modules", None)
        if isinstance(children, dict):
            held.update(id(child) for child in children.values() if child is not None)
    found = None
    for module in modules:
        if id(module) in held or not _steps_any(module, ids):
            continue
        if found is not None:
            return None
        found = module
    return found


def _steps_any(module: Any, ids: set[int]) -> bool:
    try:
        return any(id(param) in ids for param in module.parameters())
    except Exception:  # noqa: BLE001 - a module whose parameters() a script broke
        return False
