#!/bin/bash
# Reports at two commits must be byte-identical on every shared fixture: Kineto traces (the
# 8-rank directory included), nsys exports, XSpace captures, the H200 captures under tests/data
# and the example capture.
#   benchmarks/reports_identical.sh [OLD_REF]   (default: where this branch left main)
# Runs `perfguard analyze` (every report, formats csv,json,html,perfetto) with OLD_REF's code
# and the working tree's on each capture, whole run and iterations 1-2, and diffs the reports
# (gzip files decompressed: their header holds a time stamp) and the command's output.
# FIXTURE_GLOBS (space-separated globs under the shared fixtures) narrows the shared set;
# BEFORE_DIR keeps OLD_REF's reports between calls (made when missing).
# Exit status 1 on any difference.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
old_ref=${1:-$(git -C "$repo" merge-base HEAD main)}
fixtures=${PERFGUARD_FIXTURES:-$repo/../shared/fixtures}
[ -d "$fixtures" ] || fixtures=/work/shared/fixtures
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
before=${BEFORE_DIR:-$work/old}
mkdir -p "$work/src" "$work/cur" "$before" "$work/new"
git -C "$repo" archive "$old_ref" | tar -x -C "$work/src"
cp -r "$repo/perfguard" "$work/cur/"  # the working tree as it is now: edits go on meanwhile
status=0
globs=${FIXTURE_GLOBS:-"kineto/*.json.gz kineto/*/ nsys/*.sqlite"}
dbs=()
for g in $globs; do dbs+=("$fixtures"/$g); done
dbs+=("$repo"/tests/data/xplane/*.xplane.pb "$repo"/tests/data/gpu_h200/*.json.gz
      "$repo"/tests/data/gpu_h200/*/ "$repo"/examples/captures/*.json.gz)
same_tree() {  # same_tree A B: identical files, .gz compared decompressed (neither: same)
  [ ! -e "$1" ] && [ ! -e "$2" ] && return 0
  diff -rq -x '*.gz' "$1" "$2" > /dev/null || return 1
  for f in "$1"/*.gz; do
    [ -e "$f" ] || continue
    cmp -s <(zcat "$f") <(zcat "$2/$(basename "$f")") || return 1
  done
}
for db in "${dbs[@]}"; do
  db=${db%/}
  [ -e "$db" ] || continue
  if [ -d "$db" ] && ! ls "$db" | grep -q '\.json'; then continue; fi  # e.g. hta_reference/
  for variant in all iter1-2; do
    opts=(); [ $variant = iter1-2 ] && opts=(--iter-start 1 --iter-stop 2)
    n=$(basename "$(dirname "$db")")__$(basename "$db").$variant  # the folder: names repeat
    for v in old new; do
      src=$work/cur out=$work/new
      if [ $v = old ]; then
        src=$work/src out=$before
        [ -e "$out/$n.log" ] && continue
      fi
      (cd "$work" && PYTHONPATH=$src $python -m perfguard analyze --database "$db" "${opts[@]}" \
        --formats csv,json,html,perfetto --output-path "$out/$n" --force -q > "$out/$n.log" 2>&1
       echo "rc=$?" >> "$out/$n.log")
    done
    if same_tree "$before/$n" "$work/new/$n" &&
       diff <(sed "s#$before/#X/#" "$before/$n.log") <(sed "s#$work/new/#X/#" "$work/new/$n.log") \
         > /dev/null; then
      echo "identical  $n ($(ls "$work/new/$n" 2>/dev/null | wc -l) report files)"
    else
      echo "DIFFERENT  $n"; diff -r "$before/$n" "$work/new/$n" | head -5; status=1
    fi
  done
done
exit $status
