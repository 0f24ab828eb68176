# Helpers of the bench scripts. Sourced; expects ROOT (the repository).

# The median of numbers on stdin (spaces or lines).
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# torch_bench_needs NAME: Debian's python3-torch and build/python (the
# Python package), or NAME says which is missing and exits.
torch_bench_needs() {
  /usr/bin/python3 -c 'import torch' 2>/dev/null ||
    { echo "$1: no python3-torch in /usr/bin/python3" >&2; exit 1; }
  [[ -f "$ROOT/build/python/strata/torch.py" ]] ||
    { echo "$1: build/python not built (scripts/build.sh)" >&2; exit 1; }
}

# launch_samples_per_sec NAME CONFIG HOSTS WORK: `scripts/launch.sh run`
# of CONFIG on HOSTS (a run directory under WORK, binaries of build/bin);
# prints summary.json's samples_per_sec, or NAME says the run failed
# (its output shown) and exits.
launch_samples_per_sec() {
  local dir="$4/run-$RANDOM"
  "$ROOT/scripts/launch.sh" run --config "$2" --hosts "$3" \
    --run-dir "$dir" --bin-dir "$ROOT/build/bin" --quiet >"$4/launch.log" 2>&1 ||
    { cat "$4/launch.log" >&2; echo "$1: cluster run failed" >&2; exit 1; }
  sed -nE 's/^ *"samples_per_sec": ([0-9.eE+-]+),?$/\1/p' "$dir/summary.json" | head -1
}
