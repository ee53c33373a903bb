#!/usr/bin/env bash
# Scans per second of `spconv run` on many scans, batch size 1 against larger batches.
#   tools/bench_batch.sh [--net NET] [--scans N] [--batches "1 2 4 8"] [--repeat R] [--threads T]
#                        [--tool PATH] [SCAN...]
# Makes N scans (copies of the given SCANs in turn; default: KITTI 000008 from ../shared/data
# or $SPCONV_DATA_DIR, and the bundled sample) in a scratch folder, then runs
# `spconv run FOLDER --batch-size B --quiet` for every B, R rounds with the batch sizes
# interleaved so that a change in the machine's load hits them alike, and prints the median of
# the rounds per B: scans/s end to end (read, voxelize, forward, write) and of the forward alone,
# as `spconv run` reports them, with the ratio to B = 1.
set -euo pipefail
cd "$(dirname "$0")/.."

net=second scans=16 batches="1 2 4 8" repeat=3 threads="" tool=build/tools/spconv
inputs=()
while [ $# -gt 0 ]; do
  case $1 in
    --net) net=$2; shift ;;
    --scans) scans=$2; shift ;;
    --batches) batches=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --threads) threads=$2; shift ;;
    --tool) tool=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) inputs+=("$1") ;;
  esac
  shift
done
if [ ! -x "$tool" ]; then
  echo "bench_batch: no spconv tool at '$tool' (build it: cmake --build build)" >&2
  exit 2
fi
if [ ${#inputs[@]} -eq 0 ]; then
  data=${SPCONV_DATA_DIR:-../shared/data}
  [ -f "$data/kitti_000008.bin" ] && inputs+=("$data/kitti_000008.bin")
  inputs+=(data/sample_scan.bin)
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/scans"
for ((i = 0; i < scans; ++i)); do
  src=${inputs[i % ${#inputs[@]}]}
  ext=${src##*.}
  cp "$src" "$(printf '%s/scans/scan_%04d.%s' "$scratch" "$i" "$ext")"
done

thread_args=()
[ -n "$threads" ] && thread_args=(--threads "$threads")
echo "spconv run --net $net on $scans scans (${inputs[*]}), $repeat rounds, batch sizes $batches"
for ((r = 0; r < repeat; ++r)); do
  for b in $batches; do
    line=$("$tool" run "$scratch/scans" --net "$net" --batch-size "$b" --quiet \
           "${thread_args[@]}" --out "$scratch/out" | tail -n 1)
    rm -rf "$scratch/out"
    # "...: 3.25 scans/s, forward alone 4.04 scans/s"
    all=$(sed -n 's/.*: \([0-9.]*\) scans\/s, forward alone.*/\1/p' <<<"$line")
    fwd=$(sed -n 's/.*forward alone \([0-9.]*\) scans\/s.*/\1/p' <<<"$line")
    echo "$b $all $fwd" >>"$scratch/results"
  done
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%6s %14s %10s %18s %10s\n' "batch" "scans/s" "vs B=1" "forward scans/s" "vs B=1"
base_all="" base_fwd=""
for b in $batches; do
  all=$(awk -v b="$b" '$1 == b {print $2}' "$scratch/results" | median)
  fwd=$(awk -v b="$b" '$1 == b {print $3}' "$scratch/results" | median)
  [ -z "$base_all" ] && base_all=$all base_fwd=$fwd
  printf '%6s %14.2f %9.2fx %18.2f %9.2fx\n' "$b" "$all" "$(awk -v a="$all" -v z="$base_all" 'BEGIN {print a / z}')" \
    "$fwd" "$(awk -v a="$fwd" -v z="$base_fwd" 'BEGIN {print a / z}')"
done
