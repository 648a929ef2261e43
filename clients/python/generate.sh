#!/usr/bin/env bash
# Generates the gRPC stubs of proto/chorus.proto into chorus_client/_pb/ (not committed:
# run again whenever the proto changes). Needs grpcio-tools in the Python that runs it
# ($PYTHON, default python3): `pip install -r requirements-dev.txt`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto_dir="$here/../../proto"
out="$here/chorus_client/_pb"
py="${PYTHON:-python3}"
if ! "$py" -c 'import grpc_tools' 2>/dev/null; then
  echo "generate.sh: grpcio-tools is not installed for $py (pip install -r requirements-dev.txt)" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I "$proto_dir" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$proto_dir/chorus.proto"
# protoc writes `import chorus_pb2` (a top-level module); inside the package it must be
# relative.
sed -i -E 's/^import chorus_pb2 as /from . import chorus_pb2 as /' "$out/chorus_pb2_grpc.py"
grep -q '^from \. import chorus_pb2 as ' "$out/chorus_pb2_grpc.py" || {
  echo "generate.sh: could not make the stubs' import package-relative" >&2
  exit 1
}
cat > "$out/__init__.py" <<'PY'
"""Stubs generated from proto/chorus.proto by generate.sh (do not edit)."""
PY
echo "generated $(cd "$out" && ls chorus_pb2*.py* | tr '\n' ' ')in ${out#"$here/"}"
