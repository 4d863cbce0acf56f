"""The kit's JSON checked against its schema (benchmarks/results/gpu_check.schema.json),
and the markdown summary written beside it.

The validator is a small hand-written one: ``jsonschema`` is not among ddl's development
packages, and the schema uses only the keywords implemented here (type, enum, required,
properties, additionalProperties, items, minItems, minimum, pattern, local $ref). Rules a
schema cannot say are checked after it: counts match the statuses, a failed check has an
error tail, a skipped one says why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[1] / "results" / "gpu_check.schema.json"
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}


def _is(value, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON's true is no number
    return isinstance(value, _TYPES[name])


def _errors(value, schema: dict, root: dict, where: str) -> list[str]:
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is(value, n) for n in names):
            return [f"{where}: {type(value).__name__} where {'/'.join(names)} is allowed"]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        out.append(f"{where}: {value} is below {schema['minimum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        out.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        out += [f"{where}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += _errors(item, props[key], root, f"{where}.{key}")
            elif extra is False:
                out.append(f"{where}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                out += _errors(item, extra, root, f"{where}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{where}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                out += _errors(item, schema["items"], root, f"{where}[{i}]")
    return out


def validate(document: dict) -> list[str]:
    """Every way ``document`` breaks the schema or the kit's rules; empty when it is valid."""
    schema = json.loads(SCHEMA.read_text())
    problems = _errors(document, schema, schema, "$")
    if problems:
        return problems
    statuses = [c["status"] for c in document["checks"]]
    for status in ("ok", "fail", "skipped"):
        if document["counts"][status] != statuses.count(status):
            problems.append(f"$.counts.{status} is {document['counts'][status]}, the checks "
                            f"hold {statuses.count(status)}")
    for c in document["checks"]:
        if c["status"] == "fail" and not c["error_tail"]:
            problems.append(f"check {c['name']}: failed without an error tail")
        if c["status"] == "skipped" and not c["note"]:
            problems.append(f"check {c['name']}: skipped without saying why (note)")
    names = [c["name"] for c in document["checks"]]
    if len(set(names)) != len(names):
        problems.append("check names repeat")
    for entry in document.get("comparison", []):
        if not any(n.startswith(f"peer-{entry['workload']}-") for n in names):
            problems.append(f"comparison of {entry['workload']}: no peer check of it")
    return problems


def _fmt(value, scale: float = 1, unit: str = "", digits: int = 1) -> str:
    if value is None or isinstance(value, bool):
        return "-"
    return f"{value / scale:.{digits}f}{unit}"


def markdown(document: dict) -> str:
    d = document["device"]
    lines = [f"# GPU check kit: {d.get('device_name', 'CPU')} ({document['mode']} mode)", "",
             f"{document['started_at']}; torch {d.get('torch')}, CUDA {d.get('torch_cuda')}, "
             f"ddl {d.get('ddl')}; site profile `{document['site']}`; "
             f"{document['counts']['ok']} ok, {document['counts']['fail']} failed, "
             f"{document['counts']['skipped']} skipped in {document['wall_s']:.0f} s "
             f"(budget {document['budget_s']:.0f} s).", "",
             "| check | status | s | samples/s | MFU (measured peak) | MFU (profile) | "
             "data wait | device peak / model state | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in document["checks"]:
        n = c["numbers"]
        memory = "-"
        if n.get("device_peak_allocated_bytes") is not None:
            memory = (f"{_fmt(n['device_peak_allocated_bytes'], 2 ** 20, ' MiB', 0)} / "
                      f"{_fmt(n['model_state_bytes'], 2 ** 20, ' MiB', 1)}")
        note = (c["error_tail"] or c["note"] or "").strip().splitlines()
        lines.append(
            f"| {c['name']} | {c['status']} | {c['seconds']:.0f} | "
            f"{_fmt(n.get('samples_per_s'), digits=0)} | "
            f"{_fmt(n.get('mfu_vs_measured_peak'), 0.01, ' %', 2)} | "
            f"{_fmt(n.get('mfu_vs_profile_peak'), 0.01, ' %', 2)} | "
            f"{_fmt(n.get('data_wait_share'), 0.01, ' %', 0)} | {memory} | "
            f"{(note[-1] if note else '').replace('|', '/')[:160]} |")
    lines += _comparison(document.get("comparison", []))
    peak = next((c["numbers"].get("peak_flops") for c in document["checks"]
                 if c["name"] == "matmul-peak"), None)
    lines += ["", f"Measured matmul peak: {_fmt(peak, 1e9, ' GFLOP/s', 0)}. Numbers per "
              "check, and the definitions: the JSON beside this file; docs/measuring.md."]
    return "\n".join(lines) + "\n"


def _comparison(entries: list[dict]) -> list[str]:
    """ddl against the plain PyTorch peer, medians of the rounds (gpu_kit/comparison.py)."""
    if not entries:
        return []
    lines = ["", "ddl against a plain PyTorch loop (course shapes, medians over the rounds; "
             "ddl/peer: median of the rounds' ratios, min-max in brackets; GPU busy: NVML "
             "through ddl's sampler, the peer's timed epochs alone in brackets):", "",
             "| workload | rounds ok (ddl/peer) | ddl samples/s | peer samples/s | ddl/peer | "
             "GPU busy ddl | GPU busy peer | data wait ddl | data wait peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        spread = (f" ({e['ratio_min']:.2f}-{e['ratio_max']:.2f})"
                  if e["ratio_min"] is not None else "")
        steady = e["peer_gpu_busy_steady_percent"]
        lines.append(
            f"| {e['workload']} | {e['ddl_rounds_ok']}/{e['peer_rounds_ok']} of {e['rounds']} | "
            f"{_fmt(e['ddl_samples_per_s'], digits=0)} | "
            f"{_fmt(e['peer_samples_per_s'], digits=0)} | "
            f"{_fmt(e['ratio_ddl_over_peer'], digits=2)}{spread} | "
            f"{_fmt(e['ddl_gpu_busy_percent'], unit=' %', digits=0)} | "
            f"{_fmt(e['peer_gpu_busy_percent'], unit=' %', digits=0)}"
            f"{f' ({steady:.0f} %)' if steady is not None else ''} | "
            f"{_fmt(e['ddl_data_wait_share'], 0.01, ' %', 0)} | "
            f"{_fmt(e['peer_data_wait_share'], 0.01, ' %', 0)} |")
    return lines
