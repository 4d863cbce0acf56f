"""Turning pydantic's validation errors into the one line a user reads."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


def one_line(exc: ValidationError, model: type[BaseModel], *, where: str,
             key_style: str = "flag") -> str:
    """Describe the first error: where, which key or flag, what was wrong, what is allowed.

    ``key_style="flag"`` prints field ``global_batch_size`` as ``--global-batch-size``;
    ``"key"`` prints dotted TOML keys (``defaults.nproc``).
    """
    err = exc.errors()[0]
    loc = [str(part) for part in err["loc"]]
    if key_style == "flag":
        name = "--" + loc[0].replace("_", "-") if loc else "(config)"
    else:
        name = ".".join(loc) or "(top level)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        message = f"unknown key; allowed: {', '.join(allowed)}"
    elif "input" in err and err["type"] != "missing":
        message += f" (got {err['input']!r})"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    prefix = f"{where}: " if where else ""
    return f"{prefix}{name}: {message}{more}"


def _allowed_keys(model: type[BaseModel], path: list[str]) -> list[str]:
    """The field names valid at a nested location, for 'unknown key' messages."""
    for part in path:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(name for name, f in model.model_fields.items() if not f.exclude)
