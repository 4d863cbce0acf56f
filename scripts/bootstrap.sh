# Sourced by ./ddl and ./run-tests: make sure the venv exists and matches the lock.
# Creates .venv on first use (3-4 minutes on the 2-core dev machine; torch comes from the
# local wheel store) and reinstalls only when requirements.lock, requirements-dev.txt or a
# package's pyproject.toml changed. `bash scripts/bootstrap.sh --fingerprint` prints what that decision compares.
#
# The install (docs/testing.md, "Dependencies and the lock"):
#   1. every third-party package from requirements.lock, hash-checked (--require-hashes: a
#      dependency missing from the lock is an error, not a download of the day's version);
#   2. ddl's own packages (the -e lines of requirements-dev.txt) editable, --no-deps (pip
#      refuses hashes mode for editables) and --no-build-isolation (the locked hatchling);
#   3. `pip check`: the locked versions must satisfy every package's requirements.
# On an interpreter the lock was not resolved for (scripts/lock.py check-python says which,
# in one line) it installs requirements-dev.txt with the locked versions as constraints.
set -euo pipefail
DDL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DDL_VENV="${DDL_VENV:-$DDL_ROOT/.venv}"

_ddl_fingerprint() {
    cat "$DDL_ROOT/requirements.lock" "$DDL_ROOT/requirements-dev.txt" \
        "$DDL_ROOT"/packages/core/pyproject.toml "$DDL_ROOT"/packages/plugins/*/pyproject.toml \
        | sha256sum | cut -d' ' -f1
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--fingerprint" ]; then
    _ddl_fingerprint
    exit 0
fi

_ddl_pip() {
    # pip's configuration here may name local index paths that lack some projects; its
    # per-project "is ignored" warning is noise. (A pipe, not >(...), so that pip's errors
    # are out before the caller's next line; pipefail keeps pip's status.)
    { "$DDL_VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@" 2>&1 1>&3 3>&- \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2; } 3>&1
}

# Each step checks its own status: errexit does not apply inside a function called from a
# condition, and a caller may source this file in one.
_ddl_install() (
    cd "$DDL_ROOT" || return 1
    local lock=requirements.lock editables=() install=(install --root-user-action=ignore)
    mapfile -t editables < <(sed -n 's/^-e[[:space:]]\{1,\}/-e\n/p' requirements-dev.txt)
    if "$DDL_VENV/bin/python" scripts/lock.py check-python --lock "$lock"; then
        _ddl_pip "${install[@]}" --no-compile --require-hashes -r "$lock" || return 1
        _ddl_pip "${install[@]}" --no-deps --no-build-isolation "${editables[@]}" || return 1
    else
        _ddl_pip "${install[@]}" --no-compile -c <("$DDL_VENV/bin/python" scripts/lock.py \
            constraints --all --lock "$lock") -r requirements-dev.txt || return 1
    fi
    # pip byte-compiles the ~14k files one at a time (43 s of the set-up here); compileall
    # uses every core (25 s on 2). Like pip, a file that does not compile is left as is.
    "$DDL_VENV/bin/python" -m compileall -q -q -j 0 \
        "$("$DDL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || true
    if ! problems="$("$DDL_VENV/bin/python" -m pip check 2>&1)"; then
        echo "$problems" >&2
        echo "ddl: the packages in $DDL_VENV do not fit together (above): update" \
             "requirements.lock with scripts/lock.py" >&2
        return 1
    fi
)

if [ ! -f "$DDL_VENV/.ddl-installed" ] || \
   [ "$(cat "$DDL_VENV/.ddl-installed")" != "$(_ddl_fingerprint)" ]; then
    echo "ddl: setting up $DDL_VENV (first run takes a few minutes)..." >&2
    if ! { [ -x "$DDL_VENV/bin/python" ] || python3 -m venv "$DDL_VENV"; } || ! _ddl_install
    then
        echo "ddl: setting up $DDL_VENV failed (above)" >&2
        # shellcheck disable=SC2317  # sourced: return to the caller; run directly: exit
        return 1 2>/dev/null || exit 1
    fi
    _ddl_fingerprint > "$DDL_VENV/.ddl-installed"
fi
