#!/usr/bin/env bash
# Fill a folder with the wheels that install autotune on a machine without network access that
# already has PyTorch, such as a GPU cluster node: autotune's own wheel, built from this checkout,
# and every dependency in pyproject.toml's [project] dependencies except torch, with theirs.
# Torch, and the CUDA libraries (nvidia-*, cuda-*) and triton it would bring, are never
# downloaded: the target's own torch is kept (autotune needs torch>=2.2).
#
#   bash scripts/offline-wheels.sh DIR [--python-version X.Y] [--platform TAG ...]
#
# Run it on a machine with network, copy DIR to the offline machine and there, with the Python
# environment that has torch:
#
#   python -m pip install --no-index --find-links DIR autotune
#
# The target defaults to CPython 3.12 on x86-64 Linux with glibc 2.28 or newer (wheels tagged
# manylinux_2_28 or older: RHEL 8, Ubuntu 20.04 and later; recent torch wheels need as much).
# --python-version sets the target's Python; --platform, once per tag, replaces the default
# tags (e.g. --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 for ARM).
# PYTHON names the interpreter that runs pip here (default python3); it need not be the
# target's version. Only wheels are downloaded: nothing is compiled for the target.
#
# pip evaluates environment markers (python_version < "3.11", ...) for this machine, not the
# target, so the folder is then checked against the target's markers: whatever the target
# would still need is downloaded too, and a folder in which anything requires torch, triton,
# nvidia-* or cuda-* is an error.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}

usage() {  # the header above; to stdout for --help, else to stderr with status 2
  local rc=${1:-2}
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&$((rc == 0 ? 1 : 2)); exit "$rc"
}
say() { echo "offline-wheels: $*" >&2; }

dir="" python_version=3.12 platforms=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) [ $# -ge 2 ] || usage; python_version=$2; shift 2 ;;
    --platform) [ $# -ge 2 ] || usage; platforms+=("$2"); shift 2 ;;
    -h|--help) usage 0 ;;
    -*) say "unknown option $1"; usage ;;
    *) [ -z "$dir" ] || usage; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || usage
[[ "$python_version" =~ ^3\.[0-9]+$ ]] || { say "--python-version takes X.Y, such as 3.12, not '$python_version'"; exit 2; }
if [ ${#platforms[@]} -eq 0 ]; then
  # pip matches these tags literally: a wheel tagged only manylinux_2_27 needs that tag listed.
  # manylinux2014 (= manylinux_2_17) also lets pip take manylinux2010 and manylinux1 wheels.
  for minor in $(seq 28 -1 17); do platforms+=("manylinux_2_${minor}_x86_64"); done
  platforms+=(manylinux2014_x86_64)
fi
mkdir -p "$dir"
out=$(cd "$dir" && pwd)

# The target's markers and tags, and which packages must never be in the folder: the check
# prints the requirements the folder cannot yet satisfy, one a line, or fails naming a package
# that requires torch or its GPU stack.
read -r -d '' check_py <<'EOF' || true
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

folder, python, platforms = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
forbidden = lambda name: name in ("torch", "triton") or name.startswith(("pytorch-triton", "cuda-")) \
    or (name.startswith("nvidia-") and name != "nvidia-ml-py")  # nvidia-ml-py: NVML bindings, pure Python
tag = platforms[0]
system = "Linux" if "linux" in tag else "Darwin" if tag.startswith("macosx") else "Windows"
env = {"python_version": python, "python_full_version": python + ".0", "implementation_version": python + ".0",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "sys_platform": {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}[system],
       "platform_system": system, "os_name": "nt" if system == "Windows" else "posix",
       "platform_machine": re.sub(r"^(many|musl)?linux(_\d+_\d+|\d+)?_|^macosx_\d+_\d+_|^win_?", "", tag),
       "platform_release": "", "platform_version": ""}

wheels = {}  # name -> [(version, requirements)]
for path in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = Parser().parsestr(whl.read(meta).decode())
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    wheels.setdefault(canon(msg["Name"]), []).append((msg["Version"], reqs))

problems = [f"{name}: must not be in the folder (the target's torch brings its own)" for name in wheels if forbidden(name)]
missing, seen, todo = [], set(), [(Requirement("autotune"), "")]
while todo:
    req, parent = todo.pop()
    name = canon(req.name)
    if name == "torch" and parent == "autotune":
        continue  # the target's own torch
    if forbidden(name):
        problems.append(f"{parent} requires {req}")
        continue
    found = [(v, reqs) for v, reqs in wheels.get(name, []) if req.specifier.contains(v, prereleases=True)]
    if not found:
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        missing.append(f"{req.name}{extras}{req.specifier}")
    for version, reqs in found:
        if (name, version, frozenset(req.extras)) in seen:
            continue
        seen.add((name, version, frozenset(req.extras)))
        for dep in reqs:
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in ("", *req.extras)):
                todo.append((dep, name))
if problems:
    sys.exit("offline-wheels: " + "\noffline-wheels: ".join(sorted(set(problems))))
if missing:
    print("\n".join(sorted(set(missing))))
EOF
check() { "$PYTHON" -c "$check_py" "$out" "$python_version" "${platforms[@]}"; }

pip_logged() {  # pip's output only when it fails
  local log; log=$(mktemp)
  if ! "$PYTHON" -m pip "$@" >"$log" 2>&1; then cat "$log" >&2; rm -f "$log"; return 1; fi
  rm -f "$log"
}

# autotune's wheel, built from a copy of the checkout: a build in the checkout would write
# build/ there, and setuptools puts whatever a stale build/lib holds into the wheel.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
excludes=(--exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__)
case "$out/" in "$repo"/*) excludes+=("--exclude=./${out#"$repo"/}") ;; esac
tar -C "$repo" "${excludes[@]}" -cf - . | tar -C "$src" -xf -
say "building autotune's wheel from $repo"
rm -f "$out"/autotune-*.whl
pip_logged wheel --no-deps --wheel-dir "$out" "$src"

# Its dependencies except torch, then whatever the target's markers add (at most three rounds).
download=(download --only-binary=:all: --python-version "$python_version" --implementation cp --dest "$out")
for tag in "${platforms[@]}"; do download+=(--platform "$tag"); done
for round in 1 2 3 4; do
  needed=$(check)
  [ -n "$needed" ] || break
  mapfile -t needed <<<"$needed"
  if [ "$round" = 4 ]; then say "still missing after three downloads: ${needed[*]}"; exit 1; fi
  say "downloading ${needed[*]} (for CPython $python_version, ${platforms[0]} ...)"
  pip_logged "${download[@]}" "${needed[@]}"
done

count=$(ls "$out"/*.whl | wc -l)
say "$count wheels, $(du -sh "$out" | cut -f1) in $out; no torch, triton, nvidia-* or cuda-* among them"
echo "On the offline machine, with the Python environment that has torch (>=2.2):"
echo "  python -m pip install --no-index --find-links $dir autotune"
