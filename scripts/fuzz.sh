#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang into build-fuzz/
# (-DSTRATA_FUZZ=ON: libFuzzer, ASan and UBSan) and runs each one, on a
# temporary copy of its seed corpus, for a bounded time or number of runs.
# Prints a table (target, executions, exec/s, seconds, coverage, result)
# and writes it as JSON to build-fuzz/fuzz-summary.json. Exits 1 when any
# target finds something: its input is kept in build-fuzz/findings/<target>/
# and the command that reproduces it is printed. docs/security.md, "Fuzzing".
#
#   scripts/fuzz.sh                      # every target, 20 s each
#   scripts/fuzz.sh --seconds 15         # what scripts/test.sh runs
#   scripts/fuzz.sh --runs 1000000 idx   # one target, a million inputs
#
# Options: --seconds N, --runs N (executions; replaces the time bound),
# --json FILE (a copy of the summary), --no-build. Environment:
# STRATA_FUZZ_BUILD_DIR (build-fuzz), STRATA_JOBS (nproc).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${STRATA_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${STRATA_JOBS:-$(nproc)}"

# target:max_len. Inputs are kept small so that a run does many of them; the
# parsers' size checks do not depend on size beyond that (a frame's length
# field claims 2 GiB in 72 bytes).
TARGETS=(frame:4096 rdma_frame:4096 message:4096 config:4096 host_file:1024
         checkpoint_manifest:2048 checkpoint_block:4096 idx:4096 criteo:4096)

seconds=20
runs=""
json=""
build=1
only=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done

for name in "${only[@]}"; do
  [[ " ${TARGETS[*]%%:*} " =~ " $name " ]] || {
    echo "fuzz.sh: no target $name (targets: ${TARGETS[*]%%:*})" >&2; exit 2; }
done

if [[ $build -eq 1 ]]; then
  for tool in clang-14 clang++-14; do
    command -v "$tool" >/dev/null || {
      echo "fuzz.sh: $tool not found (scripts/install-deps.sh installs clang-14 and libclang-rt-14-dev)" >&2
      exit 1
    }
  done
  mkdir -p "$BUILD"
  start=$SECONDS
  cmake -S "$ROOT" -B "$BUILD" -DSTRATA_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 > "$BUILD/configure.log" 2>&1 || {
    cat "$BUILD/configure.log" >&2; exit 1; }
  cmake --build "$BUILD" -j "$JOBS" > "$BUILD/build.log" 2>&1 || {
    tail -n 60 "$BUILD/build.log" >&2; echo "fuzz.sh: build failed ($BUILD/build.log)" >&2; exit 1; }
  echo "fuzz.sh: built $BUILD/fuzz in $((SECONDS - start)) s"
fi

symbolizer="$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)"
[[ -n "$symbolizer" ]] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

work="$(mktemp -d "${TMPDIR:-/tmp}/strata-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
summary="$BUILD/fuzz-summary.json"
rows=()
failed=0
printf '%-20s %12s %9s %8s %7s  %s\n' target executions exec/s seconds cov result
for entry in "${TARGETS[@]}"; do
  name="${entry%%:*}"
  max_len="${entry##*:}"
  if [[ ${#only[@]} -gt 0 && ! " ${only[*]} " =~ " $name " ]]; then continue; fi
  bin="$BUILD/fuzz/${name}_fuzz"
  [[ -x "$bin" ]] || { echo "fuzz.sh: $bin missing (build first)" >&2; exit 1; }
  corpus="$work/$name"
  cp -r "$ROOT/tests/fuzz/corpus/$name" "$corpus"
  findings="$BUILD/findings/$name"
  mkdir -p "$findings"
  log="$BUILD/fuzz-$name.log"
  bound=(-max_total_time="$seconds")
  [[ -n "$runs" ]] && bound=(-runs="$runs")
  start=$SECONDS
  rc=0
  # No input may take 10 s, nor allocate 512 MiB at once: a frame that
  # claims 2 GiB must cost only what was sent.
  "$bin" "${bound[@]}" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" > "$log" 2>&1 || rc=$?
  took=$((SECONDS - start))
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)"
  result=ok
  if [[ $rc -ne 0 ]]; then
    failed=1
    artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
    result="FINDING (exit $rc)"
    {
      echo "fuzz.sh: $name found something (exit $rc); log: $log"
      grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -n 5 || true
      if [[ -n "$artifact" ]]; then
        echo "  input:     $artifact"
        echo "  reproduce: $bin $artifact"
        echo "  once fixed, keep it: cp $artifact $ROOT/tests/fuzz/corpus/$name/crash-<what>"
      fi
    } >&2
  fi
  printf '%-20s %12s %9s %8s %7s  %s\n' "$name" "${execs:-?}" "${rate:-?}" "$took" "${cov:-?}" "$result"
  rows+=("$(printf '{"target": "%s", "executions": %s, "exec_per_sec": %s, "seconds": %s, "cov": %s, "max_len": %s, "result": "%s"}' \
    "$name" "${execs:-null}" "${rate:-null}" "$took" "${cov:-null}" "$max_len" "$result")")
done
{
  echo "["
  for i in "${!rows[@]}"; do
    sep=","; [[ $i -eq $((${#rows[@]} - 1)) ]] && sep=""
    echo "  ${rows[$i]}$sep"
  done
  echo "]"
} > "$summary"
[[ -n "$json" ]] && cp "$summary" "$json"
exit $failed
