#!/usr/bin/env bash
# Set up and run the whole test suite: lint, types, and pytest against real servers
# (Temporal dev server, PostgreSQL, SeaweedFS S3, the local model, nsjail).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy keel store activities workflows workers client services api cli sandbox operators
# The import layers of docs/architecture.md (contracts in pyproject.toml).
.venv/bin/lint-imports
# One run of the whole suite with PostgreSQL beside it: store tests run on SQLite and
# PostgreSQL; the CLI and demo tests use the default SQLite file.
exec bash scripts/with-postgres.sh .venv/bin/pytest "$@"
