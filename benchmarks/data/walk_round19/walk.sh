#!/bin/bash
# the reviewer's walk on minGPT (round 17): base saved, then two changes, A/B and -n 2
set -u
. /work/main/.venv/bin/activate
cd /tmp/rv17
out=/tmp/walk19; rm -rf $out; mkdir -p $out
rm -rf baselines .perfguard
t() { local name=$1; shift; local s=$(date +%s.%N); "$@" > $out/$name.txt 2>&1; echo "rc=$?" >> $out/$name.txt; local e=$(date +%s.%N); echo "$name $(echo "$e - $s" | bc) s load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $out/times.txt; }
git checkout -q ae3adf5
t plain_base python -m pytest -q -p no:cacheprovider
t save_base python -m pytest -q -p no:cacheprovider --perfguard --perfguard-save
cp -r .perfguard $out/base_pg
git checkout -q qkv
t plain_qkv python -m pytest -q -p no:cacheprovider
t pg_qkv python -m pytest -q -p no:cacheprovider --perfguard
cp -r .perfguard $out/qkv_pg
t pg_qkv_n2 python -m pytest -q -p no:cacheprovider --perfguard -n 2
cp -r .perfguard $out/qkv_n2_pg
git checkout -q sync
t pg_sync python -m pytest -q -p no:cacheprovider --perfguard
cp -r .perfguard $out/sync_pg
t ab_sync python -m pytest -q -p no:cacheprovider --perfguard --perfguard-against ae3adf5
cp -r .perfguard $out/ab_sync_pg
git checkout -q ae3adf5
t pg_base_again python -m pytest -q -p no:cacheprovider --perfguard
cp -r .perfguard $out/base_again_pg
