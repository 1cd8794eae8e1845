#!/usr/bin/env bash
# The Python peers of bench/peers_bench.py in their own virtualenv, outside the repository
# ($MILLWHEEL_PEERS_VENV, default ~/.cache/millwheel/peers-venv: the repository's own tools
# — ruff, the import graph — never see PyFlink's or Bytewax's files):
# PyFlink (runs a local mini-cluster on the machine's Java 17) and Bytewax. Kept apart from
# .venv so that the project's pinned dependencies are never touched; not a dependency of
# millwheel, not used by its tests. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

FLINK=${PEERS_FLINK_VERSION:-2.3.0}
BYTEWAX=${PEERS_BYTEWAX_VERSION:-0.21.1}
VENV=${MILLWHEEL_PEERS_VENV:-$HOME/.cache/millwheel/peers-venv}
mkdir -p "$(dirname "$VENV")"
PY=${PYTHON:-python3}

if ! command -v java >/dev/null 2>&1; then
    echo "peers setup: PyFlink needs Java 17 (scripts/setup.sh installs it)" >&2
    exit 1
fi
if [[ ! -x $VENV/bin/python ]]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# (not grep -q: it would stop reading, pip would die of SIGPIPE and pipefail fail the test)
have() { "$VENV/bin/python" -m pip show "$1" 2>/dev/null | grep -x "Version: $2" >/dev/null; }
want=()
have apache-flink "$FLINK" || want+=("apache-flink==$FLINK")
have bytewax "$BYTEWAX" || want+=("bytewax==$BYTEWAX")
if [[ ${#want[@]} -gt 0 ]]; then
    echo "peers setup: installing ${want[*]} into $VENV"
    # (pip's complaints about index locations it cannot read are dropped; its errors are not)
    "$VENV/bin/python" -m pip install -q "${want[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
fi
echo "peers setup: ready ($("$VENV/bin/python" --version), apache-flink $FLINK, bytewax $BYTEWAX)"
