"""Write tests/durations.json from pytest's `--durations=0` output: per test module, the
seconds of its longest test (setup included) and of all its tests.

    ./run-tests --durations=0 > /tmp/durations.txt
    .venv/bin/python scripts/test_durations.py /tmp/durations.txt

tests/conftest.py starts the modules with the longest tests first, so that the xdist
workers end together instead of two idling while the third runs a long test that started
late. Tests inside a module keep their order (module fixtures are set up once per run).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/\S+?\.py)::")
OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def main(path: str) -> int:
    per_test: Counter[str] = Counter()  # "module::test": call + setup + teardown
    for line in Path(path).read_text().splitlines():
        match = LINE.match(line)
        if match:
            per_test[match.group(2) + line.split(match.group(2), 1)[1].strip()] += \
                float(match.group(1))
    if not per_test:
        print(f"{path}: no `--durations=0` lines found", file=sys.stderr)
        return 2
    modules: dict[str, dict[str, float]] = {}
    for test, seconds in per_test.items():
        row = modules.setdefault(test.split("::")[0], {"longest": 0.0, "total": 0.0})
        row["longest"] = max(row["longest"], round(seconds, 1))
        row["total"] = round(row["total"] + seconds, 1)
    ordered = dict(sorted(modules.items(), key=lambda kv: -kv[1]["longest"]))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    total = sum(row["total"] for row in ordered.values())
    print(f"{OUT}: {len(ordered)} modules, {total / 60:.1f} test-minutes")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
