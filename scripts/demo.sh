#!/usr/bin/env bash
# Set up and run Keel's main job on the embedded defaults: a Temporal dev server, the
# local model, a worker and the API, then the demo workflow end to end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
exec .venv/bin/keel demo "$@"
