#!/usr/bin/env bash
# Regenerates the Go code for proto/chorus.proto into chorusv1/ (chorus.pb.go and
# chorus_grpc.pb.go, checked in: `go get` cannot run protoc).
#
#   clients/go/generate.sh           regenerate in place
#   clients/go/generate.sh --check   regenerate into a temporary directory and fail if the
#                                    checked-in files differ (CI)
#
# Every tool is pinned, so the output is the same on every machine:
#   protoc              from PyPI's grpcio-tools (its bundled protoc), in a virtualenv
#   protoc-gen-go       go install google.golang.org/protobuf/cmd/protoc-gen-go
#   protoc-gen-go-grpc  go install google.golang.org/grpc/cmd/protoc-gen-go-grpc
# They are installed once into $CHORUS_GO_TOOLS (default ~/.cache/chorus/go-tools)
# and reused while their versions match the pins below.
#
# proto/chorus.proto has no `option go_package`: the import path is given with
# --go_opt=M..., so the proto file stays language-neutral.
set -euo pipefail

GRPCIO_TOOLS_VERSION=1.85.1
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
IMPORT_PATH=github.com/chorus-log/chorus/clients/go/chorusv1

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
proto_dir="$root/proto"
out_dir="$here/chorusv1"
tools="${CHORUS_GO_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/chorus/go-tools}"

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac

mkdir -p "$tools/bin"

# protoc-gen-go and protoc-gen-go-grpc, at the pinned versions.
if [ "$("$tools/bin/protoc-gen-go" --version 2>/dev/null || true)" != "protoc-gen-go $PROTOC_GEN_GO_VERSION" ]; then
  echo "generate.sh: installing protoc-gen-go $PROTOC_GEN_GO_VERSION" >&2
  (cd "$tools" && GOBIN="$tools/bin" GOFLAGS=-buildvcs=false \
    go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION")
fi
if [ "$("$tools/bin/protoc-gen-go-grpc" --version 2>/dev/null || true)" != "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}" ]; then
  echo "generate.sh: installing protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION" >&2
  (cd "$tools" && GOBIN="$tools/bin" GOFLAGS=-buildvcs=false \
    go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION")
fi

# protoc: the one bundled in grpcio-tools, in a virtualenv of our own.
venv="$tools/venv"
stamp="$venv/.grpcio-tools-$GRPCIO_TOOLS_VERSION"
if [ ! -e "$stamp" ]; then
  echo "generate.sh: installing grpcio-tools $GRPCIO_TOOLS_VERSION (protoc) into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "grpcio-tools==$GRPCIO_TOOLS_VERSION"
  touch "$stamp"
fi

gen() {
  local dest="$1"
  mkdir -p "$dest"
  (cd "$proto_dir" && "$venv/bin/python" -m grpc_tools.protoc \
    -I . \
    --plugin=protoc-gen-go="$tools/bin/protoc-gen-go" \
    --plugin=protoc-gen-go-grpc="$tools/bin/protoc-gen-go-grpc" \
    --go_out="$dest" \
    --go_opt=paths=source_relative \
    --go_opt=Mchorus.proto="$IMPORT_PATH" \
    --go-grpc_out="$dest" \
    --go-grpc_opt=paths=source_relative \
    --go-grpc_opt=Mchorus.proto="$IMPORT_PATH" \
    chorus.proto)
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gen "$tmp"

if [ "$check" = 1 ]; then
  mkdir -p "$out_dir"
  # Only the generated files: chorusv1/ may hold hand-written ones too.
  if ! diff -ru \
    <(cd "$out_dir" && find . -name '*.pb.go' | sort) \
    <(cd "$tmp" && find . -name '*.pb.go' | sort) >/dev/null; then
    echo "generate.sh --check: the set of generated files differs from chorusv1/:" >&2
    diff -u <(cd "$out_dir" && find . -name '*.pb.go' | sort) \
      <(cd "$tmp" && find . -name '*.pb.go' | sort) >&2 || true
    echo "run clients/go/generate.sh and commit the result" >&2
    exit 1
  fi
  status=0
  for f in "$tmp"/*.pb.go; do
    if ! diff -u "$out_dir/$(basename "$f")" "$f" >"$tmp/diff" 2>&1; then
      echo "generate.sh --check: chorusv1/$(basename "$f") is stale:" >&2
      head -n 60 "$tmp/diff" >&2
      status=1
    fi
  done
  if [ "$status" != 0 ]; then
    echo "run clients/go/generate.sh and commit the result" >&2
    exit 1
  fi
  echo "generate.sh --check: chorusv1/ is up to date with proto/chorus.proto"
  exit 0
fi

mkdir -p "$out_dir"
rm -f "$out_dir"/*.pb.go
cp "$tmp"/*.pb.go "$out_dir"/
echo "generate.sh: wrote $(cd "$tmp" && ls *.pb.go | tr '\n' ' ')into ${out_dir#"$root"/}/"
