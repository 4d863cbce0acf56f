# Sourced by ./ddl and ./run-tests: make sure the venv exists and matches the lock.
# Creates .venv on first use (~1.5 minutes on the 2-core dev machine the first time, ~5 s
# once the lock is in the machine's cache) and reinstalls only when requirements.lock,
# requirements-dev.txt or a package's pyproject.toml changed.
# `bash scripts/bootstrap.sh --fingerprint` prints what that decision compares.
#
# The install (docs/testing.md, "Dependencies and the lock"):
#   1. every third-party package from requirements.lock, hash-checked (--require-hashes: a
#      dependency missing from the lock is an error, not a download of the day's version),
#      installed once per machine, lock and interpreter into a cached venv
#      (~/.cache/ddl/deps/KEY; DDL_DEPS_CACHE=DIR moves it, =off installs into .venv as
#      before) and hard-linked from there into .venv (scripts/venv_link.py: ~80 s -> ~2 s);
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
_ddl_compile() {
    # pip byte-compiles the ~14k files one at a time (43 s of the set-up here); compileall
    # uses every core (25 s on 2). Like pip, a file that does not compile is left as is.
    "$DDL_VENV/bin/python" -m compileall -q -q -j 0 \
        "$("$DDL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || true
}

# A venv made for linking has no pip of its own (the cached venv's is linked in).
_ddl_ensure_pip() {
    "$DDL_VENV/bin/python" -c "import pip" 2>/dev/null || \
        "$DDL_VENV/bin/python" -m ensurepip --default-pip >/dev/null
}

# The cached venv for this lock and interpreter, or nothing where there is none to use.
_ddl_deps_dir() {
    [ "${DDL_DEPS_CACHE:-}" = off ] && return 0
    command -v flock >/dev/null || return 0
    local root="${DDL_DEPS_CACHE:-}"
    if [ -z "$root" ]; then
        [ -n "${XDG_CACHE_HOME:-}${HOME:-}" ] || return 0
        root="${XDG_CACHE_HOME:-$HOME/.cache}/ddl/deps"
    fi
    # Only where hard links from it can reach the venv: on another file system the link
    # step fails and the cache is dead weight, ~6 GB (in $HOME by default, where JSC's
    # quotas are small).
    local near="$root"
    while [ ! -e "$near" ]; do near="$(dirname "$near")"; done
    [ "$(stat -c %d "$near")" = "$(stat -c %d "$DDL_VENV")" ] || return 0
    local key
    key="$({ cat "$DDL_ROOT/requirements.lock"
             "$DDL_VENV/bin/python" -c 'import sys; print(sys.version, sys.base_prefix)'
           } | sha256sum | cut -c1-16)" || return 0
    echo "$root/$key"
}

# Install the lock into the cached venv $1 unless a finished one is there. Holds a lock
# file meanwhile (two clones setting up at once install it once), then removes all but the
# two most recently used cached venvs: the venvs linked from them keep their files.
_ddl_fill_deps() (
    local dir="$1"
    mkdir -p "$(dirname "$dir")" && exec 9>"$dir.lock" && flock 9 || return 1
    if [ ! -f "$dir/.ddl-complete" ]; then
        echo "ddl: installing requirements.lock into $dir (once per machine and lock)" >&2
        rm -rf "$dir"
        "$DDL_VENV/bin/python" -m venv "$dir" || return 1
        DDL_VENV="$dir" _ddl_pip install --root-user-action=ignore --no-compile \
            --require-hashes -r "$DDL_ROOT/requirements.lock" || return 1
        DDL_VENV="$dir" _ddl_compile
    fi
    touch "$dir/.ddl-complete"
    local old
    # shellcheck disable=SC2012  # the entries are ours: hexadecimal keys
    ls -td "$(dirname "$dir")"/*/.ddl-complete | tail -n +3 | while IFS= read -r old; do
        rm -rf "$(dirname "$old")" "$(dirname "$old").lock"
    done
)

_ddl_install() (
    cd "$DDL_ROOT" || return 1
    local lock=requirements.lock editables=() install=(install --root-user-action=ignore)
    mapfile -t editables < <(sed -n 's/^-e[[:space:]]\{1,\}/-e\n/p' requirements-dev.txt)
    if "$DDL_VENV/bin/python" scripts/lock.py check-python --lock "$lock"; then
        local deps=""
        # only into a venv made just now: linking beside installed packages could leave two
        # versions of one; an existing venv gets pip's update as before
        [ "$1" = new ] && deps="$(_ddl_deps_dir)"
        if [ -n "$deps" ] && _ddl_fill_deps "$deps" && \
                "$DDL_VENV/bin/python" scripts/venv_link.py "$deps" "$DDL_VENV"; then
            echo "ddl: linked the locked packages from $deps" >&2
        else
            if [ -n "$deps" ]; then
                echo "ddl: installing into $DDL_VENV instead" >&2
                rm -rf "$DDL_VENV" && python3 -m venv "$DDL_VENV" || return 1
            fi
            _ddl_ensure_pip || return 1
            _ddl_pip "${install[@]}" --no-compile --require-hashes -r "$lock" || return 1
            _ddl_compile
        fi
        _ddl_pip "${install[@]}" --no-deps --no-build-isolation "${editables[@]}" || return 1
    else
        _ddl_ensure_pip || return 1
        _ddl_pip "${install[@]}" --no-compile -c <("$DDL_VENV/bin/python" scripts/lock.py \
            constraints --all --lock "$lock") -r requirements-dev.txt || return 1
        _ddl_compile
    fi
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
    _ddl_made=old
    if [ ! -x "$DDL_VENV/bin/python" ]; then
        _ddl_made=new
        # ddl's floor (requires-python in packages/core/pyproject.toml), said here rather
        # than as pip's "requires a different Python" about some package
        if ! _ddl_v="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])
sys.exit(sys.version_info < (3, 10))' 2>/dev/null)"; then
            echo "ddl: python3 is ${_ddl_v:+Python }${_ddl_v:-missing or broken}; ddl needs" \
                 "Python >= 3.10: put one first on PATH (e.g. module load Python)" >&2
            _ddl_made=failed
        elif ! python3 -m venv --without-pip "$DDL_VENV"; then
            _ddl_made=failed
        fi
        unset _ddl_v
    fi
    if [ "$_ddl_made" = failed ] || ! _ddl_install "$_ddl_made"; then
        echo "ddl: setting up $DDL_VENV failed (above)" >&2
        # shellcheck disable=SC2317  # sourced: return to the caller; run directly: exit
        return 1 2>/dev/null || exit 1
    fi
    _ddl_fingerprint > "$DDL_VENV/.ddl-installed"
    unset _ddl_made
fi
