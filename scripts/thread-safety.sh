#!/usr/bin/env bash
# The lock annotations, checked by a compiler: clang's -Wthread-safety over
# every C++ source of the tree (daemons, libraries, tools, tests, benches),
# syntax only, with the flags of the build's compile_commands.json
# (scripts/build.sh writes it). Any warning fails. Run by ctest
# (thread_safety_test); by hand: scripts/thread-safety.sh [FILE...].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${STRATA_BUILD_DIR:-$ROOT/build}"
CLANG="${STRATA_CLANG:-clang++-14}"
JOBS="${STRATA_JOBS:-$(nproc)}"
DB="$BUILD/compile_commands.json"
if ! command -v "$CLANG" > /dev/null; then
  echo "thread-safety.sh: $CLANG not found (scripts/install-deps.sh --test installs clang-14)" >&2
  exit 2
fi
[[ -f $DB ]] || { echo "thread-safety.sh: $DB missing: run scripts/build.sh first" >&2; exit 2; }
exec /usr/bin/python3 - "$DB" "$ROOT" "$CLANG" "$JOBS" "$@" <<'PY'
import concurrent.futures, json, os, shlex, subprocess, sys
db, root, clang, jobs = sys.argv[1:5]
only = {os.path.abspath(f) for f in sys.argv[5:]}
flags = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
         "-Wno-unknown-warning-option", "-Wno-unused-command-line-argument"]
todo, seen = [], set()
for e in json.load(open(db)):
    f = os.path.abspath(os.path.join(e["directory"], e["file"]))
    if not f.startswith(root + "/") or not f.endswith(".cc") or f in seen:
        continue
    if only and f not in only:
        continue
    seen.add(f)
    words = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    args, skip = [], False
    for w in words[1:]:  # the build's flags, less its output and the file
        if skip:
            skip = False
        elif w == "-o":
            skip = True
        elif w not in ("-c", f, e["file"]):
            args.append(w)
    todo.append((e["directory"], [clang] + flags + args + [f], f))
print(f"thread-safety.sh: {len(todo)} source file(s), {jobs} at a time, with {clang}",
      flush=True)
def check(item):
    d, cmd, f = item
    r = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return f, r.returncode, r.stdout
failed = 0
with concurrent.futures.ThreadPoolExecutor(int(jobs)) as pool:
    for f, rc, text in pool.map(check, todo):
        if rc != 0 or "-Wthread-safety" in text:
            failed += 1
            print(text, end="" if text.endswith("\n") else "\n", flush=True)
if failed:
    print(f"thread-safety.sh: FAILED in {failed} file(s): the annotations above do not hold",
          file=sys.stderr)
    sys.exit(1)
print("thread-safety.sh: clean")
PY
