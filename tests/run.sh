#!/bin/sh
# Runs every test program under the given build directories and adds up their
# "# result P F S" lines. A program that crashes or prints no result line counts as
# one failure. The last line is the total: "N passed, N failed[, N skipped]".
set -u

passed=0 failed=0 skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

for build in "$@"; do
    for t in $(find "$build/tests" -type f -name 'test_*' -perm -u+x 2>/dev/null | sort); do
        echo "== $t"
        timeout 900 "$t" >"$log" 2>&1
        status=$?
        cat "$log"
        result=$(grep '^# result ' "$log" | tail -n 1)
        if [ -z "$result" ]; then
            echo "   $t exited with status $status and no result line"
            failed=$((failed + 1))
            continue
        fi
        set -- $result
        passed=$((passed + $3)) failed=$((failed + $4)) skipped=$((skipped + $5))
        if [ "$status" -ne 0 ] && [ "$4" -eq 0 ]; then
            echo "   $t exited with status $status"
            failed=$((failed + 1))
        fi
    done
done

if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
