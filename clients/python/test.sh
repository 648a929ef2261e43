#!/usr/bin/env bash
# The Python client's tests, as CI runs them: a venv (clients/python/.venv, or $VENV),
# the pinned tools from PyPI, the stubs generated, the package installed, and pytest
# against real local clusters of the chorus binary: $CHORUS_BIN (CI passes the one its
# cargo test built), or else target/debug/chorus, built here first. Exits non-zero on any
# failure; a skipped test counts as one.
set -euo pipefail
started=$SECONDS
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -n "${CHORUS_BIN:-}" ] && [ -e "$CHORUS_BIN" ]; then
  CHORUS_BIN="$(cd "$(dirname "$CHORUS_BIN")" && pwd)/$(basename "$CHORUS_BIN")"
  export CHORUS_BIN
fi
cd "$here"

if [ -z "${CHORUS_BIN:-}" ]; then
  # Incremental: quick when nothing changed. Retried once, as another build on the
  # machine may hold the build directory or be mid-edit.
  (cd "$repo" && { nice cargo build --locked -q -p chorus-server --bin chorus \
    || { sleep 30; nice cargo build --locked -q -p chorus-server --bin chorus; }; })
  export CHORUS_BIN="$repo/target/debug/chorus"
fi
[ -x "$CHORUS_BIN" ] || { echo "test.sh: no chorus binary at $CHORUS_BIN" >&2; exit 1; }

venv="${VENV:-$here/.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
PYTHON="$venv/bin/python" ./generate.sh
# No build isolation: setuptools is pinned in requirements-dev.txt (nothing else fetched).
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps .
"$venv/bin/python" -m pip check
# Built artifacts of `pip install .` in the source tree.
rm -rf build chorus_client.egg-info

# The tests import the installed package (--import-mode=importlib: the source tree is not
# put on sys.path), from a directory other than the source tree.
(cd / && "$venv/bin/python" -c 'import chorus_client; print("testing", chorus_client.__file__)')
"$venv/bin/pytest" -rfEsx -q "$@"
echo "clients/python/test.sh: passed in $((SECONDS - started))s"
