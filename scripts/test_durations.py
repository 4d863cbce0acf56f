"""Write tests/durations.json (seconds per test module) from pytest's `--durations=0` output.

    ./run-tests --durations=0 > /tmp/durations.txt
    .venv/bin/python scripts/test_durations.py /tmp/durations.txt

tests/conftest.py starts the costliest modules first, so that the xdist workers end
together instead of two idling while the third runs a long test that started late. Test
times inside a module stay in their order (module fixtures are set up once per run of it).
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
    seconds: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    if not seconds:
        print(f"{path}: no `--durations=0` lines found", file=sys.stderr)
        return 2
    ordered = {module: round(s, 1) for module, s in seconds.most_common()}
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} modules, {sum(ordered.values()) / 60:.1f} test-minutes")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
