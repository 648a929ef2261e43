#!/usr/bin/env bash
# CI for the Go client (clients/go): the generated code matches proto/chorus.proto,
# go vet, and go test against real local clusters (`chorus dev`), which must not skip.
#
#   clients/go/test.sh
#
# The server binary is $CHORUS_BIN; when unset, target/debug/chorus is built (or brought
# up to date) with cargo first. Needs go, python3 (for generate.sh's protoc) and, without
# CHORUS_BIN, cargo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

step() { echo "== clients/go: $*"; }

step "generate.sh --check"
./generate.sh --check

step "go vet"
go vet ./...

if [ -z "${CHORUS_BIN:-}" ]; then
  step "cargo build -p chorus-server --bin chorus"
  (cd "$root" && nice cargo build --locked -p chorus-server --bin chorus)
  export CHORUS_BIN="$root/target/debug/chorus"
fi

step "go test (CHORUS_BIN=$CHORUS_BIN)"
CHORUS_REQUIRE_CLUSTER=1 go test -count=1 -timeout 5m ./...
