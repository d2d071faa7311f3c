#!/usr/bin/env bash
# fuzz.sh runs a short pass ($FUZZTIME, default 10s) of every fuzz target.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" at the end of -fuzztime, having found nothing and
# written no failing input (golang/go#75804, fixed in Go 1.27). Such a run
# is tried again, at most twice; a run that writes a failing input under
# testdata/fuzz, or fails any other way, fails at once.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
log=$(mktemp)
# inputs counts the saved inputs of a target (failing ones are added there).
inputs() { if [[ -d "$1" ]]; then find "$1" -type f | wc -l; else echo 0; fi; }
trap 'rm -f "$log"' EXIT

for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for f in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		for try in 1 2 3; do
			echo "fuzz $pkg $f ($fuzztime)"
			before=$(inputs "$dir/testdata/fuzz/$f")
			if go test -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
				break
			fi
			after=$(inputs "$dir/testdata/fuzz/$f")
			if ((after == before)) && ((try < 3)) &&
				grep -q -- "--- FAIL: $f " "$log" && grep -qx '    context deadline exceeded' "$log" &&
				! grep -q 'Failing input written' "$log"; then
				echo "fuzz: $f hit Go's fuzztime deadline race (golang/go#75804) with no failing input; trying again"
				continue
			fi
			cat "$log"
			exit 1
		done
	done
done
