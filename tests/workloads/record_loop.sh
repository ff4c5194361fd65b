#!/usr/bin/env bash
# Record tests/workloads/ddp_bn_nosync.py N times in a row (default 20); print the number of failed recordings.
# Run from the repository root: PYTHON=/path/to/python tests/workloads/record_loop.sh [N [nbox record options]]
# e.g. record_loop.sh 20 --warmup 3 --iterations 8 --capture 2
set -u
n=${1:-20}; shift || true; py=${PYTHON:-python}; fails=0; tmp=$(mktemp -d)
for i in $(seq 1 "$n"); do
  if ! flock /tmp/nbox-ranks.lock env PYTHONPATH="$PWD" "$py" -m nbox record -n 2 "$@" -o "$tmp/b$i" --overwrite \
      -- tests/workloads/ddp_bn_nosync.py > "$tmp/log$i" 2>&1; then
    fails=$((fails + 1)); echo "run $i failed: $(tail -1 "$tmp/log$i")"
  fi
  rm -rf "$tmp/b$i"
done
echo "recorded $n times: $fails failed"; rm -rf "$tmp"
