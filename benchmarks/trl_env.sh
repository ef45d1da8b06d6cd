#!/usr/bin/env bash
# Create the virtual environment TRL runs in for the GRPO benchmarks (TRL is not a Kiln dependency
# and never goes into .venv). Usage: bash benchmarks/trl_env.sh   (then pass --trl-python to the
# benchmark, or let it find ${KILN_TRL_VENV:-/tmp/kiln-trl-venv}/bin/python).
#
# torch is pinned exactly: the CPU build of 2.13.0 is the one on local disk, and a looser spec
# would pull a multi-GB CUDA build. transformers and peft are pinned to the versions Kiln's own
# environment uses, so both sides run the same model code; trl/accelerate/datasets are pinned to
# the versions the figures in docs/performance.md were taken with.
set -euo pipefail
VENV="${KILN_TRL_VENV:-/tmp/kiln-trl-venv}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KILN_PY="${KILN_PYTHON:-$HERE/../.venv/bin/python}"

pin() {  # the version Kiln's venv has, or the fallback given
    local name="$1" fallback="$2" v=""
    if [ -x "$KILN_PY" ]; then
        v="$("$KILN_PY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)"
    fi
    echo "${v:-$fallback}"
}
TRANSFORMERS="$(pin transformers 5.24.0)"
PEFT="$(pin peft 0.21.2)"
ACCELERATE="$(pin accelerate 1.15.0)"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet \
    "torch==2.13.0" \
    "trl==1.16.0" \
    "transformers==$TRANSFORMERS" \
    "peft==$PEFT" \
    "accelerate==$ACCELERATE" \
    "datasets==5.2.0"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("TRL venv ready:", ", ".join(f"{p} {m.version(p)}" for p in ("torch", "trl", "transformers", "peft", "accelerate", "datasets")))
PY
echo "python: $VENV/bin/python"
