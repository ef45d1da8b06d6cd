# Sourced by scripts/serve and scripts/test: make .venv and install Kiln into it (idempotent).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
# One setup at a time: two first starts at once ran two pip installs into one .venv, and the loser
# died on a file the winner was replacing. The lock is held by a subshell, so it is let go when the
# setup ends, not when the command that sourced this (kiln serve, the test run) does.
(
  if command -v flock >/dev/null; then
    flock 9
  fi
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
  fi
  # Reinstall only when the dependency list changed (pip is slow even when nothing is to do).
  stamp=.venv/.kiln-deps-$(sha256sum pyproject.toml | cut -c1-16)-${1:-run}
  if [ ! -f "$stamp" ]; then
    # torch is pinned exactly (torch==2.13.0): its CPU build is on local disk; a looser pin pulls CUDA.
    .venv/bin/python -m pip install -q -e ".${KILN_EXTRAS:-}"
    touch "$stamp"
  fi
) 9>".venv.setup.lock"
export PATH="$PWD/.venv/bin:$PATH"
