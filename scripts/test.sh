#!/usr/bin/env bash
# The test command, in two tiers (README, "Tests"):
#
#   scripts/test.sh            the whole suite: lint, types, the import layers, then every
#                              test against real servers (Temporal dev server, PostgreSQL,
#                              SeaweedFS S3, the embedded model, nsjail) on KEEL_TEST_WORKERS
#                              pytest-xdist workers (default 3; 0 runs them in this process).
#                              Before a merge, and what CI runs (.ci/run).
#   scripts/test.sh --quick    lint, types, the import layers, the unit tests, history
#                              replay and one worker-kill fault test per family
#                              (tests/quick_tier.txt; SQLite only): under 3 minutes.
#
# Further arguments go to pytest (scripts/test.sh --quick -k gate). pytest's exit status
# is the script's; 5 means the arguments selected no test, and counts as a failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tier=full
if [[ "${1:-}" == "--quick" ]]; then
    tier=quick
    shift
fi
source scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy keel store activities workflows workers client services api cli sandbox operators
# The import layers of docs/architecture.md (contracts in pyproject.toml).
.venv/bin/lint-imports
# Three workers on two cores: most tests wait on servers, subprocesses and Temporal far
# more than they compute, so a third worker fills the cores while the others wait.
workers=${KEEL_TEST_WORKERS:-3}
if [[ $tier == quick ]]; then
    # One fault test per family (tests/quick_tier.txt) beside the unit tests and replay.
    mapfile -t faults < <(grep -v -e '^#' -e '^[[:space:]]*$' tests/quick_tier.txt)
    # Unit tests marked full_tier (seconds of computing each) run in the whole suite only.
    exec .venv/bin/pytest -n "$workers" --dist loadgroup -m "not full_tier" \
        tests/*/unit tests/test_replay.py "${faults[@]}" "$@"
fi
# One run of the whole suite with PostgreSQL beside it: store tests run on SQLite and
# PostgreSQL; the CLI and demo tests use the default SQLite file. Each test file runs
# whole on one worker, the embedded model's tests all on one (tests/conftest.py), longest
# first (tests/conftest.py: pytest_xdist_make_scheduler).
exec bash scripts/with-postgres.sh .venv/bin/pytest \
    -n "$workers" --dist loadgroup "$@"
