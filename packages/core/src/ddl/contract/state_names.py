"""Renaming a model's and optimizer's state dict keys, and back.

Strategies name parameters as their wrappers do (``module.`` prefixes, pipeline stages);
checkpoints use one name per parameter so that any strategy can load them. The default
``Strategy.checkpoint_state`` uses these; ddl.worker.checkpointing.checkpoint writes the result."""

from __future__ import annotations

from typing import Any

_OPTIM_SECTIONS = ("state.", "param_groups.")


def rename_state(state: dict[str, dict[str, Any]], name_of
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """Rename the keys of {"model": ..., "optim": ...} (the optimizer state flattened by
    torch, keys ``state.<param>.<key>`` / ``param_groups.<param>.<key>``) with ``name_of``
    applied to each parameter name; also return the way back."""
    model_names = {fqn: name_of(fqn) for fqn in state["model"]}
    renamed: dict[str, dict[str, Any]] = {"model": {}, "optim": {}}
    back: dict[str, dict[str, str]] = {"model": {}, "optim": {}}
    for fqn, value in state["model"].items():
        renamed["model"][model_names[fqn]] = value
        back["model"][model_names[fqn]] = fqn
    by_length = sorted(model_names, key=len, reverse=True)  # longest match first
    for key, value in state["optim"].items():
        new = key
        for section in _OPTIM_SECTIONS:
            if key.startswith(section):
                rest = key[len(section):]
                fqn = next((f for f in by_length if rest.startswith(f + ".")), None)
                if fqn is not None:
                    new = section + model_names[fqn] + rest[len(fqn):]
                break
        renamed["optim"][new] = value
        back["optim"][new] = key
    return renamed, back


def restore_names(state: dict[str, dict[str, Any]], back: dict[str, dict[str, str]]
                  ) -> dict[str, dict[str, Any]]:
    return {part: {back[part][k]: v for k, v in values.items()}
            for part, values in state.items()}


# --- saving ------------------------------------------------------------------------------
