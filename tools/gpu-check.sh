#!/usr/bin/env bash
# One prepared run of the CUDA checks on a lent GPU machine (see ../shared/GPU.md):
#   1. unpack the carried packages of .gpu-deps/*.deb into .gpu-deps/root (never into /);
#   2. configure for sm_90 without PCL against that prefix, build only what the checks need;
#   3. print `nvidia-smi -L` and `spconv version` (the library's build and device report);
#   4. run the CUDA tests (ctest -R 'cuda|backend_ops|test_context'), the test data coming from
#      .gpu-deps/data;
#   5. run `spconv bench` on whole networks (basic f16 / f32, forward and backward; SECOND) on
#      both devices, then every benchmark tools/bench_* that accepts `--device cuda`, also with
#      `--device cpu`;
#   6. compile the PyTorch extension against this build and run python/tests/test_cuda_binding.py
#      when python3 has a CUDA torch;
#   7. with the time left, compute-sanitizer: memcheck of test_cuda_tensor, test_backend_ops (the
#      voxelizer and rulebook builders against the CPU) and test_cuda_conv, racecheck of
#      test_backend_ops (shared memory: Thrust's and CUB's sorts and scans; our kernels use none);
#   8. print a short table last: per test, cases passed/failed/skipped; per benchmark case,
#      median ms, GFLOP/s and GB/s on the GPU and the speed-up over the CPU run; each step's
#      verdict (a step cut short by the budget says so, and is not counted as a failure).
# The whole run keeps to GPU_CHECK_BUDGET_S seconds (default 420, under the device tool's 600 s a
# command and leaving time for a rerun within a session's 15 minutes): every step runs under
# `timeout` with at most its own cap and what is left of the budget, the most wanted first.
# Full logs go to $OUT (at most 8 files come back from the device machine; we write 7:
# configure.log, build.log, ctest.xml, ctest.log, bench.log, sanitizer.log, summary.txt).
#
# Prepare here with tools/gpu-deps.sh, then call the device tool's `run` with
#   command: bash tools/gpu-check.sh      carry: [".gpu-deps"]      timeout_s: 480
# Without a GPU (as here) it still configures, builds and runs: the CUDA tests then skip.
#
# Benchmark contract: a program tools/bench_<name>.c whose source mentions `--device` is run as
# `bench_<name> --device cuda` and `bench_<name> --device cpu` (with $BENCH_ARGS), and prints one
# line per measured case:
#   result case=<name> median_ms=<ms> gflops=<GFLOP/s or 0> gbps=<GB/s or 0>
# measured with CUDA events on the GPU, after a warm-up, as the median of repetitions.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
out=${OUT:-$repo/out/gpu-check}
build=${GPU_CHECK_BUILD:-$repo/build-gpu}
deps=$repo/.gpu-deps
root=$deps/root
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
status=0
budget=${GPU_CHECK_BUDGET_S:-420}
started=$(date +%s)
verdicts=() # one line per step, printed in the summary

section() { printf '\n==== %s ====\n' "$*"; }
verdict() { verdicts+=("$*"); echo "$*"; }
# Seconds a step may take: its own cap, or what is left of the budget less 20 s for the summary;
# 0 when under 10 s are left (the step is then skipped).
allow() {
  local left=$(( budget - ($(date +%s) - started) - 20 ))
  [ "$left" -lt 10 ] && { echo 0; return; }
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# ---- 1. carried packages ---------------------------------------------------------------------
section "dependencies"
shopt -s nullglob
debs=("$deps"/*.deb)
# dpkg -x where dpkg exists; otherwise the same by hand: a .deb is an ar archive whose data.tar.*
# member holds the files.
unpack_deb() {
  if command -v dpkg >/dev/null; then dpkg -x "$1" "$root"; return; fi
  local member
  member=$(ar t "$1" | grep '^data\.tar')
  case $member in
    *.xz) ar p "$1" "$member" | tar -xJ -C "$root" ;;
    *.zst) ar p "$1" "$member" | tar --zstd -x -C "$root" ;;
    *.gz) ar p "$1" "$member" | tar -xz -C "$root" ;;
    *) ar p "$1" "$member" | tar -x -C "$root" ;;
  esac
}
if [ ${#debs[@]} -gt 0 ]; then
  mkdir -p "$root"
  for d in "${debs[@]}"; do unpack_deb "$d"; done
  # dpkg -x runs no maintainer scripts, so the update-alternatives links that point the generic
  # OpenBLAS names at the pthread build are missing: make them, as the postinst would.
  lib=$root/usr/lib/x86_64-linux-gnu
  for name in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3; do
    target=$lib/openblas-pthread/$name
    [ -e "$target" ] && ln -sfn "openblas-pthread/$name" "$lib/$name"
  done
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "unpacked ${#debs[@]} packages into $root"
else
  echo "no .gpu-deps/*.deb (run tools/gpu-deps.sh to carry them): using the system's packages"
fi
data_dir=$deps/data
[ -d "$data_dir" ] || data_dir=$repo/../shared/data
echo "test data: $data_dir"

# ---- 2. configure and build ------------------------------------------------------------------
section "configure and build ($jobs jobs) in $build"
configure=(cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
           -DSPCONV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DSPCONV_PCL=OFF
           -DSPCONV_TEST_DATA_DIR="$data_dir")
[ -d "$root/usr" ] && configure+=(-DCMAKE_PREFIX_PATH="$root/usr")
if ! "${configure[@]}" >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  echo "gpu-check: configure failed (full log: configure.log)"
  exit 1
fi
grep -E '^-- spconv:' "$out/configure.log"

targets=(spconv_cli spconv) # spconv: the shared library the PyTorch binding's check links
# Target names are the file names without .c or .cu (ninja stops at an unknown target before
# building anything, -k 0 or not).
for src in tests/test_cuda_*.c tests/test_cuda_*.cu tests/test_backend_ops.c tests/test_context.c tools/bench_*.c; do
  name=$(basename "$src")
  name=${name%.cu}
  targets+=("${name%.c}")
done
echo "targets: ${targets[*]}"
start=$(date +%s)
# -k 0: a target that fails to build must not keep the others from being checked.
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k 0 >"$out/build.log" 2>&1; then
  grep -E 'error|FAILED' "$out/build.log" | head -30
  echo "gpu-check: some targets failed to build (full log: build.log); checking the rest"
  status=1
fi
echo "built in $(( $(date +%s) - start )) s"

# ---- 3. the machine and the library's view of it --------------------------------------------
section "devices"
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo "nvidia-smi: not found"; fi
if [ -x "$build/tools/spconv" ]; then
  "$build/tools/spconv" version
else
  echo "spconv version: the CLI did not build"
fi

# ---- 4. CUDA tests ---------------------------------------------------------------------------
section "CUDA tests"
# Whole outputs in the JUnit file: the summary counts the cases of each program from them.
limit=$(allow 180)
if timeout "$limit" ctest --test-dir "$build" -R 'cuda|backend_ops|test_context' --output-on-failure \
      --output-junit "$out/ctest.xml" --timeout "$limit" \
      --test-output-size-passed 1000000 --test-output-size-failed 1000000 \
      >"$out/ctest.log" 2>&1; then
  verdict "CUDA tests: passed"
else
  verdict "CUDA tests: FAILED (ctest.log)"
  status=1
fi
tail -25 "$out/ctest.log"
# A library that sees no GPU skips every CUDA test and still passes: not on a GPU machine.
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
   [ -x "$build/tools/spconv" ] && "$build/tools/spconv" version | grep -q 'devices: 0'; then
  verdict "devices: nvidia-smi lists a GPU but spconv sees none: every CUDA test skipped, FAILED"
  status=1
fi

# ---- 5. whole networks (issue 11's targets) ---------------------------------------------------
# `spconv bench` on the device, rulebooks in every forward as spconv's benchmark counts them:
# basic on spconv's own voxels in f16 and f32, forward and training backward, and SECOND on a
# KITTI scan; each case also on the CPU for the ratio. The JSON's medians (on the GPU the device's
# clock, CUDA events; on the CPU the wall clock) become `result` lines of bench.log, so the
# summary lists them with the rest. One more GPU run, basic-f16-phases, times the conv phases
# (--phases) and the device's own ceilings (--peak-size): the GEMM phase against cuBLAS on one
# large product of the same dtype, gather and scatter against the device's copy bandwidth;
# basic-f16-ws64mib reruns basic-f16 under a 64 MiB conv workspace budget (more, smaller groups).
section "network benchmarks"
: >"$out/bench.log"
spconv_cli=$build/tools/spconv
net_case() { # name device args...
  local name=$1 device=$2
  shift 2
  # Not under $out: only a few files come back from the device machine.
  local json="$build/net-$name-$device.json"
  local limit
  limit=$(allow 60)
  if [ "$limit" -eq 0 ]; then
    verdict "spconv bench $name --device $device: skipped (budget spent)"
    return
  fi
  echo "### spconv-bench --device $device $*" >>"$out/bench.log"
  if timeout "$limit" "$spconv_cli" bench "$@" --device "$device" --json "$json" >>"$out/bench.log" 2>&1; then
    python3 - "$json" "$name" >>"$out/bench.log" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
name = sys.argv[2]
for pass_name, p in d["passes"].items():
    wall = p["wall_ms"]["median"]
    device = (p.get("device_ms") or {}).get("median")
    ms = device if device is not None else wall
    clock = "cuda-events" if device is not None else "host"
    print(f"result case={name}-{pass_name} median_ms={ms:.4f} gflops={p.get('gflops') or 0} "
          f"gbps=0 clock={clock} wall_ms={wall:.4f}")
    if d.get("time_phases"):
        print(f"result case={name}-{pass_name}-gemm-phase median_ms={p['phases_ms']['gemm']['median']:.4f} "
              f"gflops={p.get('gemm_gflops') or 0} gbps=0 share_of_peak={p.get('gemm_share_of_peak')}")
        for phase in ("gather", "scatter"):
            if p.get(f"{phase}_gbps"):
                print(f"result case={name}-{pass_name}-{phase} median_ms={p['phases_ms'][phase]['median']:.4f} "
                      f"gflops=0 gbps={p[f'{phase}_gbps']:.1f} copy_gbps={d.get('copy_gbps')}")
if d.get("device_clock") and d.get("sgemm_peak_gflops"):
    print(f"result case={name}-device-gemm-peak median_ms=0 gflops={d['sgemm_peak_gflops']:.1f} gbps=0")
    print(f"result case={name}-device-copy median_ms=0 gflops=0 gbps={d.get('copy_gbps') or 0:.1f}")
PY
  else
    local rc=$?
    echo "### exit status $rc for spconv bench $* --device $device" >>"$out/bench.log"
    if [ "$rc" -eq 124 ]; then
      verdict "spconv bench $name --device $device: cut short after $limit s"
    else
      verdict "spconv bench $name --device $device: FAILED (exit status $rc, bench.log)"
      status=1
    fi
  fi
}
if [ -x "$spconv_cli" ] && [ -f "$data_dir/spconv_test_indices.i32" ]; then
  for device in cuda cpu; do
    reps=10
    [ "$device" = cpu ] && reps=2
    net_case basic-f16 "$device" --net basic --input "$data_dir" --dtype f16 --repeat "$reps" --warmup 2 --peak-size 0
    if [ "$device" = cuda ]; then
      net_case basic-f16-phases cuda --net basic --input "$data_dir" --dtype f16 --repeat 3 --warmup 1 --peak-size 4096 --phases
      # the conv's steps under a 64 MiB workspace budget (several groups per large layer) against
      # the default (one group per layer on a large GPU): what grouping offsets buys on this GPU
      SPCONV_CUDA_CONV_WORKSPACE_KIB=65536 net_case basic-f16-ws64mib cuda --net basic --input "$data_dir" --dtype f16 --repeat "$reps" --warmup 2 --peak-size 0
    fi
    net_case basic-f32 "$device" --net basic --input "$data_dir" --dtype f32 --repeat "$reps" --warmup 2 --peak-size 0
    net_case basic-f16-train "$device" --net basic --input "$data_dir" --dtype f16 --backward --repeat "$reps" --warmup 2 --peak-size 0
    if [ -f "$data_dir/kitti_000008.bin" ]; then
      net_case second-f32 "$device" --net second --input "$data_dir/kitti_000008.bin" --repeat "$reps" --warmup 2 --peak-size 0
    fi
  done
  grep '^result case=basic\|^result case=second' "$out/bench.log" || true
else
  echo "network benchmarks: skipped (no spconv CLI or no spconv_test_* data in $data_dir)"
fi

# ---- 5b. the other benchmarks ------------------------------------------------------------------
section "benchmarks"
benches=0
for bench in "$build"/tools/bench_*; do
  [ -x "$bench" ] || continue
  # Asked of the source, not of `--help`: a program that ignores --help would run in full.
  grep -q -- '--device' "tools/$(basename "$bench").c" 2>/dev/null || continue
  benches=$((benches + 1))
  for device in cuda cpu; do
    echo "### $(basename "$bench") --device $device ${BENCH_ARGS:-}" >>"$out/bench.log"
    # BENCH_ARGS is split into words on purpose: it holds options.
    # shellcheck disable=SC2086
    limit=$(allow 60)
    if [ "$limit" -eq 0 ]; then
      verdict "$(basename "$bench") --device $device: skipped (budget spent)"
      continue
    fi
    timeout "$limit" "$bench" --device "$device" ${BENCH_ARGS:-} >>"$out/bench.log" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ]; then
      verdict "$(basename "$bench") --device $device: cut short after $limit s"
    elif [ "$rc" -ne 0 ]; then
      echo "### exit status $rc for $(basename "$bench") --device $device" >>"$out/bench.log"
      verdict "$(basename "$bench") --device $device: FAILED (exit status $rc, bench.log)"
      status=1
    fi
  done
done
echo "$benches benchmark program(s) with --device"

# ---- 6. the PyTorch binding on CUDA ----------------------------------------------------------
# The extension compiled just in time against this build, then python/tests/test_cuda_binding.py
# (as a script: the machine may have no pytest): CUDA conv against the CPU, memory from torch's
# caching allocator, work on torch's current stream. Its output goes to stdout and ctest.log.
section "PyTorch binding on CUDA"
limit=$(allow 150)
if [ "$limit" -eq 0 ]; then
  verdict "binding on CUDA: skipped (budget spent)"
elif python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  SPCONV_C_BUILD_DIR=$build PYTHONPATH=$repo/python:$repo/python/tests timeout "$limit" \
    python3 "$repo/python/tests/test_cuda_binding.py" >"$build/binding.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    verdict "binding on CUDA: passed"
  elif [ "$rc" -eq 124 ]; then
    verdict "binding on CUDA: cut short after $limit s"
  else
    verdict "binding on CUDA: FAILED (ctest.log)"
    status=1
  fi
  tail -15 "$build/binding.log"
  { echo "### PyTorch binding on CUDA"; cat "$build/binding.log"; } >>"$out/ctest.log"
else
  verdict "binding on CUDA: skipped (python3 with a CUDA torch not found)"
fi

# ---- 7. compute-sanitizer, with the time left ------------------------------------------------
# Out-of-bounds or misaligned device accesses can go unnoticed when results still compare
# equal; memcheck reports them. racecheck sees only shared memory, which our kernels do not use:
# it checks Thrust's and CUB's sorts and scans under the map builders. Every run appends to
# sanitizer.log. A device the sanitizer refuses (as on gVisor machines: "Device not supported")
# is a skip, not a failure; a run the budget cuts short is reported as such.
section "compute-sanitizer"
: >"$out/sanitizer.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitize() { # tool test cap [extra sanitizer options]
  local tool=$1 test=$2 cap=$3 limit rc
  shift 3
  if [ ! -x "$sanitizer" ]; then verdict "compute-sanitizer $tool of $test: skipped (not found)"; return; fi
  if [ ! -x "$build/tests/$test" ]; then verdict "compute-sanitizer $tool of $test: skipped (not built)"; return; fi
  limit=$(allow "$cap")
  if [ "$limit" -eq 0 ]; then verdict "compute-sanitizer $tool of $test: skipped (budget spent)"; return; fi
  echo "### $tool $test (limit $limit s)" >>"$out/sanitizer.log"
  local log="$build/sanitizer-$tool-$test.log"
  SPCONV_DATA_DIR=$data_dir timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 1 "$@" \
    "$build/tests/$test" >"$log" 2>&1
  rc=$?
  cat "$log" >>"$out/sanitizer.log"
  if grep -q 'Device not supported' "$log"; then
    verdict "compute-sanitizer $tool of $test: skipped (the sanitizer does not support this device)"
  elif [ "$rc" -eq 0 ]; then
    verdict "compute-sanitizer $tool of $test: clean"
  elif [ "$rc" -eq 124 ]; then
    verdict "compute-sanitizer $tool of $test: cut short after $limit s (no error reported before)"
    grep -q 'ERROR SUMMARY: [1-9]\|Invalid\|Race reported' "$log" && {
      verdict "compute-sanitizer $tool of $test: errors before the cut, FAILED"; status=1; }
  else
    tail -20 "$log"
    verdict "compute-sanitizer $tool of $test: FAILED (sanitizer.log)"
    status=1
  fi
}
# API errors are not reported for test_cuda_tensor: it provokes a failing cudaMalloc on purpose.
sanitize memcheck test_cuda_tensor 60 --report-api-errors no
sanitize memcheck test_backend_ops 120
sanitize racecheck test_backend_ops 90
sanitize memcheck test_cuda_conv 120

# ---- 8. summary table ------------------------------------------------------------------------
section "summary"
python3 - "$out/ctest.xml" "$out/bench.log" <<'PY' | tee "$out/summary.txt"
import re, sys
import xml.etree.ElementTree as ET

junit, bench_log = sys.argv[1], sys.argv[2]
def count(label, text):
    return sum(int(n) for n in re.findall(r"\[\s*%s\s*\] (\d+) test" % label, text))
print(f"{'test':<28} {'ctest':<8} {'passed':>6} {'failed':>6} {'skipped':>7} {'seconds':>8}")
try:
    cases = ET.parse(junit).getroot().iter("testcase")
except (OSError, ET.ParseError) as err:
    cases = []
    print(f"(no ctest results: {err})")
for case in cases:
    text = "".join(node.text or "" for node in case.iter("system-out"))
    verdict = case.get("status") or ("fail" if case.find("failure") is not None else "run")
    print(f"{case.get('name'):<28} {verdict:<8} {count('PASSED', text):>6} "
          f"{count('FAILED', text):>6} {count('SKIPPED', text):>7} "
          f"{float(case.get('time', 0)):>8.2f}")

results, program, device = {}, None, None
for line in open(bench_log, encoding="utf-8", errors="replace"):
    header = re.match(r"### (\S+) --device (\S+)", line)
    if header:
        program, device = header.groups()
        continue
    if line.startswith("result "):
        fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        results.setdefault((program, fields.get("case", "?")), {})[device] = fields
if results:
    print()
    print(f"{'benchmark case':<40} {'cuda ms':>9} {'GFLOP/s':>9} {'GB/s':>8} {'cpu ms':>9} "
          f"{'speed-up':>8}")
    for (prog, case), by_device in sorted(results.items()):
        gpu, cpu = by_device.get("cuda", {}), by_device.get("cpu", {})
        ms = lambda r: float(r.get("median_ms", "nan"))
        ratio = ms(cpu) / ms(gpu) if gpu and cpu and ms(gpu) > 0 else float("nan")
        print(f"{prog + ':' + case:<40} {ms(gpu):>9.3f} {float(gpu.get('gflops', 'nan')):>9.1f} "
              f"{float(gpu.get('gbps', 'nan')):>8.1f} {ms(cpu):>9.3f} {ratio:>7.1f}x")
PY
{
  echo
  echo "steps:"
  for v in "${verdicts[@]}"; do echo "  $v"; done
  echo "gpu-check: $([ $status -eq 0 ] && echo OK || echo FAILED) in $(( $(date +%s) - started )) s of a $budget s budget (logs in $out)"
} | tee -a "$out/summary.txt"
exit $status
