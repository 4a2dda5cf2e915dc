"""Write tests/durations.json from a pytest run's JUnit XML: the seconds each test file
took (setup, call and teardown of its tests). tests/conftest.py hands files to the
pytest-xdist workers longest first by this table, so no long file starts last and runs
alone; a file not in it counts as the median. Refresh it after adding or slowing a file:

    KEEL_TEST_WORKERS=2 PYTEST_ADDOPTS=--junitxml=/tmp/suite.xml ./scripts/test.sh
    .venv/bin/python -m tests.support.durations /tmp/suite.xml

The order only decides which file starts when; a wrong table makes a run longer, never
a test pass or fail.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "durations.json"


def file_seconds(junit: Path) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "")
        # pytest's classname is the module path, plus the class for a test in one.
        parts = module.split(".")
        while parts and not (ROOT / Path(*parts)).with_suffix(".py").is_file():
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return {name: round(s, 1) for name, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    table = file_seconds(Path(argv[1]))
    if not table:
        print(f"no test cases in {argv[1]}", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"{OUT}: {len(table)} files, {sum(table.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
