#!/usr/bin/env bash
# The main job, from nothing: installs what is missing, builds, and trains the
# Fashion-MNIST MLP on a local cluster (1 master, 2 pservers, 2 workers) from
# conf/local.yaml and conf/hosts.local, showing progress. Extra arguments go
# to launch.sh (e.g. --config conf/asp.yaml, --run-dir DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Only what building and training need (the test suite's tools come with
# scripts/test.sh).
"$ROOT/scripts/install-deps.sh" --train
"$ROOT/scripts/build.sh"
exec "$ROOT/scripts/launch.sh" run --config "$ROOT/conf/local.yaml" \
  --hosts "$ROOT/conf/hosts.local" "$@"
