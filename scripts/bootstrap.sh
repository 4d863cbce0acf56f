# Sourced by ./ddl and ./run-tests: make sure the venv exists and matches the requirements.
# Creates .venv on first use (about 2 minutes: torch comes from the local wheel store) and
# reinstalls only when requirements-dev.txt or a package's pyproject.toml changed.
set -euo pipefail
DDL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DDL_VENV="${DDL_VENV:-$DDL_ROOT/.venv}"

_ddl_fingerprint() {
    cat "$DDL_ROOT/requirements-dev.txt" "$DDL_ROOT"/packages/core/pyproject.toml \
        "$DDL_ROOT"/packages/plugins/*/pyproject.toml | sha256sum | cut -d' ' -f1
}

if [ ! -f "$DDL_VENV/.ddl-installed" ] || \
   [ "$(cat "$DDL_VENV/.ddl-installed")" != "$(_ddl_fingerprint)" ]; then
    echo "ddl: setting up $DDL_VENV (first run takes a few minutes)..." >&2
    [ -x "$DDL_VENV/bin/python" ] || python3 -m venv "$DDL_VENV"
    (cd "$DDL_ROOT" && "$DDL_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r requirements-dev.txt 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2))
    _ddl_fingerprint > "$DDL_VENV/.ddl-installed"
fi
