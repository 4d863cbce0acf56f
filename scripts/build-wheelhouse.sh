#!/usr/bin/env bash
# build-wheelhouse.sh [--torch | --cpu-torch] [--offline] DIR — the wheels a container build
# installs. The CPU image's offline wheelhouse in one line: --cpu-torch --offline DIR.
#
# Always: a fresh wheel of the core and of every plugin (pip wheel --no-deps), so the image
# needs no checkout. Old ddl wheels in DIR are removed first; other wheels are kept, so a
# second run only rebuilds ddl's own.
#   --torch    also copy torch and torchvision at the versions of requirements.lock
#              (--no-deps: their dependencies still come from the index). PyPI's torch is
#              the CUDA build (GBs of CUDA libraries).
#   --cpu-torch  the same pair as CPU builds, from PyTorch's CPU index only ($TORCH_INDEX,
#              default https://download.pytorch.org/whl/cpu; empty: pip's configured
#              sources), and fails if the torch it got is a CUDA build. $TORCH overrides
#              the pair (e.g. TORCH="torch==2.13.0+cpu torchvision==0.28.0"). For the CPU image.
#   --offline  also put every dependency in DIR (sdists built into wheels), so the image can
#              be built with `ddl container build --offline` where the build host has no
#              index. With --torch this includes torch's own dependencies (GBs for the CUDA
#              build of torch; none with --cpu-torch). The versions are requirements.lock's.
# Always, too: DIR/constraints.txt, every locked package as NAME==VERSION except the torch
# stack (torch, torchvision, triton, nvidia-*, cuda-*) that GPU images take from their base;
# the container definitions install with `-c constraints.txt` (scripts/lock.py constraints).
# pip takes the wheels from wherever its configuration points (PyPI, or local wheel stores).
# The wheels must suit the image's Python: run with PYTHON=python3.X when it differs from
# this checkout's venv (e.g. 3.12 in LUMI's PyTorch images).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch=0 offline=0 dir=""
for arg in "$@"; do
    case "$arg" in
        --torch) torch=1 ;;
        --offline) offline=1 ;;
        --cpu-torch) torch=cpu ;;
        -h|--help) sed -n '2,25s/^# \{0,1\}//p' "$0"; exit 0 ;;
        -*) echo "build-wheelhouse.sh: unknown option $arg; allowed: --torch, --cpu-torch, --offline" >&2; exit 2 ;;
        *) [ -z "$dir" ] || { echo "build-wheelhouse.sh: one DIR only (got $dir and $arg)" >&2; exit 2; }
           dir="$arg" ;;
    esac
done
[ -n "$dir" ] || { echo "usage: build-wheelhouse.sh [--torch | --cpu-torch] [--offline] DIR" >&2; exit 2; }
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$ROOT/.venv/bin/python" ] && PYTHON="$ROOT/.venv/bin/python"
fi
pip=("$PYTHON" -m pip --disable-pip-version-check)
# The core's extras every image installs (containers/*.def): `ddl report` draws with
# matplotlib, and runs write TensorBoard events.
EXTRAS="[plots,tensorboard]"
# pip's configuration here may name local index paths that lack some projects; its
# per-project "is ignored" warning is noise.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
rm -f "$dir"/ddl-*.whl "$dir"/ddl_*.whl
packages=("$ROOT/packages/core" "$ROOT"/packages/plugins/*/)
echo "build-wheelhouse: ddl wheels -> $dir" >&2
# Built in place (not in an isolated copy), so the core wheel picks up ../../sites as
# ddl/_sites (packages/core/pyproject.toml): the site profiles travel inside the image.
# With the locked hatchling where PYTHON has it (the venv: 5 s instead of 30 s).
isolation=()
"$PYTHON" -c "import hatchling" 2>/dev/null && isolation=(--no-build-isolation)
"${pip[@]}" wheel --quiet --no-deps "${isolation[@]}" --wheel-dir "$dir" "${packages[@]}"

# The lock's versions, for pip inside the image (without the torch stack) and for the
# downloads below (all of them).
"$PYTHON" "$ROOT/scripts/lock.py" constraints > "$dir/constraints.txt"
all_constraints="$(mktemp)"
trap 'rm -f "$all_constraints"' EXIT
"$PYTHON" "$ROOT/scripts/lock.py" constraints --all > "$all_constraints"
echo "build-wheelhouse: $(wc -l < "$dir/constraints.txt") locked versions" \
     "-> $dir/constraints.txt" >&2

pins=() torch_wheels=()
if [ "$torch" != 0 ]; then
    mapfile -t pins < <(grep -E '^(torch|torchvision)==' "$all_constraints")
    [ "${#pins[@]}" = 2 ] || { echo "build-wheelhouse: torch/torchvision not found in requirements.lock" >&2; exit 1; }
fi
if [ "$torch" = 1 ]; then
    versions=("${pins[@]/==/-}")  # torch==2.14.1 -> torch-2.14.1, as in the file names
    if ls "$dir/${versions[0]}"-*.whl "$dir/${versions[1]}"-*.whl >/dev/null 2>&1; then
        echo "build-wheelhouse: ${pins[*]} already in $dir" >&2
    else
        echo "build-wheelhouse: ${pins[*]} -> $dir" >&2
        "${pip[@]}" download --quiet --no-deps --dest "$dir" "${pins[@]}"
    fi
elif [ "$torch" = cpu ]; then
    [ -z "${TORCH:-}" ] || read -ra pins <<< "$TORCH"
    index=()  # --index-url, not --extra-: an unreachable CPU index must not mean PyPI's CUDA torch
    [ -z "${TORCH_INDEX-https://download.pytorch.org/whl/cpu}" ] ||
        index=(--index-url "${TORCH_INDEX-https://download.pytorch.org/whl/cpu}")
    echo "build-wheelhouse: ${pins[*]} (CPU builds) -> $dir" >&2
    got="$(mktemp -d)"
    trap 'rm -rf "$all_constraints" "$got"' EXIT
    "${pip[@]}" download --quiet --no-deps "${index[@]}" --dest "$got" "${pins[@]}"
    # A CUDA build of torch requires nvidia-* distributions (Linux); a CPU build none.
    "$PYTHON" - "$got"/torch-*.whl <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
cuda = [l for l in meta.decode().splitlines() if l.startswith("Requires-Dist: nvidia-")]
if cuda:
    sys.exit(f"build-wheelhouse: {sys.argv[1].rsplit('/', 1)[-1]} is a CUDA build of torch "
             f"({cuda[0].split(': ', 1)[1].split(';')[0].strip()} ...), not a CPU build; "
             "is the CPU index reachable? (TORCH_INDEX, TORCH)")
PY
    for wheel in "$got"/*.whl; do torch_wheels+=("$dir/${wheel##*/}"); done
    mv "$got"/*.whl "$dir"/
fi

# What the dependencies depend on: the pins, the lock and ddl's declared requirements.
# Resolving them again takes about a minute even when every wheel is already here, so a
# stamp named after them marks a complete set.
requirements_stamp() {
    "$PYTHON" - "$dir" "$all_constraints" "$torch" "$EXTRAS" "${pins[@]}" <<'PY'
import hashlib, pathlib, sys, zipfile
h = hashlib.sha256(" ".join(sys.argv[3:]).encode())
h.update(pathlib.Path(sys.argv[2]).read_bytes())
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("ddl*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        h.update(b"".join(l for l in z.read(meta).splitlines(True) if l.startswith(b"Requires-Dist")))
print(h.hexdigest()[:16])
PY
}

if [ "$offline" = 1 ]; then
    stamp="$dir/.complete-$(requirements_stamp)"
    if [ -f "$stamp" ]; then
        echo "build-wheelhouse: dependencies already complete in $dir" >&2
    else
        # What the images install (containers/*.def), with every dependency as a wheel.
        core=("$dir"/ddl-*.whl)
        wanted=("${core[0]}$EXTRAS" "$dir"/ddl_*.whl torchrun-jsc accelerate)
        constraints="$all_constraints"
        if [ "$torch" = cpu ]; then
            # The CPU pair's own files (a +cpu version, or $TORCH's) against the lock
            # without its torch stack: the lock's torch is PyPI's CUDA build.
            wanted+=("${torch_wheels[@]}") constraints="$dir/constraints.txt"
        else
            wanted+=("${pins[@]}")
        fi
        echo "build-wheelhouse: all dependencies -> $dir (offline builds)" >&2
        "${pip[@]}" wheel --quiet --wheel-dir "$dir" --find-links "$dir" \
            --constraint "$constraints" "${wanted[@]}"
        rm -f "$dir"/.complete-*
        touch "$stamp"
    fi
fi
ls "$dir" | sed 's/^/  /' >&2
