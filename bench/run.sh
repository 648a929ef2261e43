#!/usr/bin/env bash
# The benchmark matrix: Chorus (embedded and gRPC clients), etcd-raft, openraft, raft-rs
# (with raft-engine) and the disk's ceiling, side by side, alternating, with medians; then
# the commit-point modes.
#
#   bench/run.sh                 # the whole matrix (168 runs: about 45 minutes, 40 with --duration 8)
#   bench/run.sh --smoke         # one short point per system (about 2 minutes after builds)
#   bench/run.sh --help          # every option (bench/matrix.py)
#
# Builds the Chorus binaries (release; a failed build stops here, since measuring stale
# binaries would mislead). The peers are built up front too, so their build time never
# lands in a measured run; a peer that does not build only warns here, and its runs are
# then recorded as failed. Plots need matplotlib, installed into bench/.venv from PyPI
# (bench/requirements.txt); if that fails the matrix still runs, without plots.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

for a in "$@"; do
  if [[ $a == -h || $a == --help ]]; then
    exec python3 bench/matrix.py --help
  fi
done

cargo build --release --locked -p chorus-server -p chorus-bench

if ! (cd bench/peers/etcd-raft && go build -o bin/etcd-raft-peer .); then
  echo "run.sh: warning: etcd-raft peer does not build; its runs will fail" >&2
fi
if ! (cd bench/peers/openraft && cargo build --release --locked); then
  echo "run.sh: warning: openraft peer does not build; its runs will fail" >&2
fi
if ! (cd bench/peers/raft-rs && cargo build --release --locked); then
  echo "run.sh: warning: raft-rs peer does not build; its runs will fail" >&2
fi

EXTRA=()
if [[ ! -x bench/.venv/bin/python ]]; then
  python3 -m venv bench/.venv || rm -rf bench/.venv
fi
# pip returns at once without the network when the pinned version is already installed.
if [[ ! -x bench/.venv/bin/python ]] ||
  ! bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt; then
  echo "run.sh: warning: could not install bench/requirements.txt into bench/.venv; no plots" >&2
  EXTRA=(--no-plots)
fi
PY=bench/.venv/bin/python
[[ -x $PY ]] || PY=python3
exec "$PY" bench/matrix.py "$@" "${EXTRA[@]}"
