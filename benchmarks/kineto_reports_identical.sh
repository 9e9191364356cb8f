#!/bin/bash
# Reports at two commits must be byte-identical on every Kineto fixture and nsys export
# (FIXTURE_GLOBS, space-separated globs under the fixtures, narrows the set).
#   benchmarks/kineto_reports_identical.sh [OLD_REF]   (default: where this branch left main)
# Runs `perfguard analyze --formats csv,json` with OLD_REF's code and the working tree's on
# every Kineto fixture (the 8-rank directory included) and the example capture, and diffs
# the reports and the command's output. Exit status 1 on any difference.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
old_ref=${1:-$(git -C "$repo" merge-base HEAD main)}
fixtures=${PERFGUARD_FIXTURES:-$repo/../shared/fixtures}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/old" "$work/new"
git -C "$repo" archive "$old_ref" | tar -x -C "$work/src"
status=0
globs=${FIXTURE_GLOBS:-"kineto/*.json.gz kineto/*/ nsys/*.sqlite"}
dbs=()
for g in $globs; do dbs+=("$fixtures"/$g); done
for db in "${dbs[@]}" "$repo"/examples/captures/*.json.gz; do
  db=${db%/}
  [ -e "$db" ] || continue
  if [ -d "$db" ] && ! ls "$db" | grep -q '\.json'; then continue; fi  # e.g. hta_reference/
  n=$(basename "$db")
  for v in old new; do
    src=$repo; [ $v = old ] && src=$work/src
    (cd "$work" && PYTHONPATH=$src python -m perfguard analyze --database "$db" \
      --formats csv,json --output-path "$work/$v/$n" --force > "$work/$v/$n.log" 2>&1
     echo "rc=$?" >> "$work/$v/$n.log")
  done
  if diff -r "$work/old/$n" "$work/new/$n" > /dev/null &&
     diff <(sed "s#$work/old/#X/#" "$work/old/$n.log") <(sed "s#$work/new/#X/#" "$work/new/$n.log") > /dev/null; then
    echo "identical  $n ($(ls "$work/new/$n" | wc -l) report files)"
  else
    echo "DIFFERENT  $n"; diff -r "$work/old/$n" "$work/new/$n" | head -5; status=1
  fi
done
exit $status
