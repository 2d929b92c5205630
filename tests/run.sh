#!/bin/sh
# Runs every test program under the given build directories and adds up their
# "# result P F S" lines. A program that crashes or prints no result line counts as
# one failure. The last line is the total: "N passed, N failed[, N skipped]".
#
# Programs run LLMS_TEST_JOBS at a time (default: the number of online CPUs), and each
# one's output is printed whole when it ends, under its name and its time. The engine's
# thread pools step down to fewer threads when another process holds the cores, so two
# programs on two cores take about half the time of one after the other. The programs in
# ALONE compare times they measure against fixed bounds or against each other (an app
# served within a second during an attack, a cancel within a second, a recompute cost
# against its prediction, a thread pool's response to stalls, a regex's linear time), so
# they run afterwards, one at a time, with the machine to themselves.
set -u

ALONE="test_abuse test_sched test_ctxload test_threadpool test_regex"

# One program (called by xargs below): its output and exit status go to files named after
# it in the work directory; the output is printed under a lock so that two never mix.
if [ "${1:-}" = --one ]; then
    work=$2 t=$3
    name=$(printf '%s' "$t" | tr / _)
    start=$(date +%s)
    timeout 900 "$t" >"$work/$name.log" 2>&1
    echo $? >"$work/$name.status"
    secs=$(($(date +%s) - start))
    flock "$work/print.lock" sh -c 'echo "== $1 (${2} s)"; cat "$3"' _ "$t" "$secs" "$work/$name.log"
    exit 0
fi

jobs=${LLMS_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

all=$(for build in "$@"; do
    find "$build/tests" -type f -name 'test_*' -perm -u+x 2>/dev/null | sort
done)
shared= alone=
for t in $all; do
    case " $ALONE " in
    *" $(basename "$t") "*) alone="$alone $t" ;;
    *) shared="$shared $t" ;;
    esac
done

printf '%s\n' $shared | xargs -r -n 1 -P "$jobs" sh "$0" --one "$work"
for t in $alone; do
    sh "$0" --one "$work" "$t"
done

passed=0 failed=0 skipped=0
for t in $all; do
    name=$(printf '%s' "$t" | tr / _)
    status=$(cat "$work/$name.status" 2>/dev/null || echo 127)
    result=$(grep '^# result ' "$work/$name.log" 2>/dev/null | tail -n 1)
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

if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
