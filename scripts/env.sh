# Sourced by scripts/serve and scripts/test: create or reuse the virtual environment.
# BATCHGATE_VENV picks its folder (default .venv); it is rebuilt when pyproject.toml or the
# client's api/client/pyproject.toml changes (.ci/run keys its folder on the same two files).
# torch 2.13.0 goes in first, alone: an unpinned torch would pull a CUDA build of several GB.
# Then the dev, ray and minilm extras (minilm: the real model, which a client does without),
# so the real model's tests and those on a real Ray cluster run too. The client is a
# distribution of its own (batchgate-client, in api/client/: httpx and itself alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${BATCHGATE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.batchgate-$(cat pyproject.toml api/client/pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    echo "setting up $VENV (torch 2.13.0 CPU first, then batchgate and its dependencies)" >&2
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
    "$VENV/bin/python" -m pip install --quiet -e ".[dev,ray,minilm]" -e ./api/client
    rm -f "$VENV"/.batchgate-*
    touch "$STAMP"
    echo "$PWD" > "$VENV/.source"
fi
if [ "$(cat "$VENV/.source" 2>/dev/null)" != "$PWD" ]; then
    # A reused environment (CI keeps one outside the clone) must point at this checkout.
    "$VENV/bin/python" -m pip install --quiet --no-deps -e . -e ./api/client
    echo "$PWD" > "$VENV/.source"
fi
PATH="$(cd "$VENV" && pwd)/bin:$PATH"
export PATH HF_HUB_OFFLINE=1
