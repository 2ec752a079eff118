#!/usr/bin/env bash
# nri-unit.sh: NRI's own unit tests (./pkg/...) on the patched NRI tree, with the race detector as
# upstream's `make test` runs them. Prints the `go test -json` event stream.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cd "$(tree_dir nri)"
exec go test -json -race -count=1 -p 2 ./pkg/...
