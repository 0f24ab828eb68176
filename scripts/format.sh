#!/usr/bin/env bash
# The code's layout is clang-format's (.clang-format: Google style, 100
# columns, as docs/architecture.md and STYLE.md say).
#   scripts/format.sh          reformats every C++ and CUDA file in place
#   scripts/format.sh --check  lists the files that differ and fails (ctest:
#                              format_test)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FORMAT="${STRATA_CLANG_FORMAT:-clang-format-14}"
command -v "$FORMAT" > /dev/null || {
  echo "format.sh: $FORMAT not found (scripts/install-deps.sh --test installs clang-format-14)" >&2
  exit 2
}
cd "$ROOT"
# The tracked sources (and new ones not yet added), not the build trees.
mapfile -t files < <({ git ls-files -co --exclude-standard -- '*.cc' '*.h' '*.cu' 2>/dev/null ||
                       find . -path ./build -prune -o -path ./build-fuzz -prune -o \
                         \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) -print; } |
                     grep -v '^\(\./\)\?build' | sort -u)
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    [[ -f $f ]] || continue
    if ! "$FORMAT" --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    printf '%s\n' "${bad[@]}"
    echo "format.sh: ${#bad[@]} of ${#files[@]} file(s) differ from $FORMAT's layout: run scripts/format.sh" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} file(s) follow .clang-format"
  exit 0
fi
"$FORMAT" --style=file -i "${files[@]}"
echo "format.sh: formatted ${#files[@]} file(s)"
