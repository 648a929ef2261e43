#!/usr/bin/env bash
# The benchmark matrix: Chorus (embedded and gRPC clients), etcd-raft, openraft and the
# disk's ceiling, side by side, alternating, with medians; then the commit-point modes.
#
#   bench/run.sh                 # the whole matrix (about 40 minutes)
#   bench/run.sh --smoke         # one short point per system (about 2 minutes after builds)
#   bench/run.sh --help          # every option (bench/matrix.py)
#
# Builds the Chorus binaries (release); the peers build themselves in their run.sh. Plots
# need matplotlib, installed into bench/.venv from PyPI on first use.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"
cargo build --release --locked -p chorus-server -p chorus-bench
# Build the peers once up front so their build time never lands inside a measured run.
(cd bench/peers/etcd-raft && go build -o bin/etcd-raft-peer .)
(cd bench/peers/openraft && cargo build --release --locked)
if [[ ! -x bench/.venv/bin/python ]]; then
  python3 -m venv bench/.venv
fi
if ! bench/.venv/bin/python -c 'import matplotlib' 2>/dev/null; then
  bench/.venv/bin/pip install --quiet -r bench/requirements.txt
fi
exec bench/.venv/bin/python bench/matrix.py "$@"
