#!/usr/bin/env bash
# Serve the counter environment (counter_env.py) on 127.0.0.1:$PORT with PyPI openenv==0.10.0.
#
# Environment (all optional):
#   PORT                  where it listens (default 8990, the OpenEnv guide's port)
#   OPENENV_VENV          its virtual environment, created on first use (default
#                         ${KILN_HOME:-~/.kiln}/openenv-0.10.0); it needs the package index once
#   COUNTER_MAX_SESSIONS  sessions served at once (default 16: run_loop.sh collects 16 episodes at a time)
#   COUNTER_MAX_DELTA     the largest move (default 3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${OPENENV_VENV:-${KILN_HOME:-$HOME/.kiln}/openenv-0.10.0}"
python="$venv/bin/python"

installed() {
  env -u PYTHONPATH PYTHONNOUSERSITE=1 "$python" -c \
    "import importlib.metadata as m; raise SystemExit(m.version('openenv') != '0.10.0')" 2>/dev/null
}

if ! installed; then
  echo "creating $venv with openenv==0.10.0" >&2
  python3 -m venv "$venv"
  env -u PYTHONPATH PYTHONNOUSERSITE=1 "$python" -m pip install -q "openenv==0.10.0"
fi

# Only this folder on the import path: Kiln's package of the same name must not shadow the environment's.
cd "$here"
exec env -u PYTHONPATH PYTHONNOUSERSITE=1 COUNTER_MAX_SESSIONS="${COUNTER_MAX_SESSIONS:-16}" \
  "$python" -m uvicorn counter_env:app --host 127.0.0.1 --port "${PORT:-8990}" --log-level warning
