#!/usr/bin/env bash
# Real single-GPU captures of current training loops through orch (tests/fixtures/modern/).
#
#   capture_modern.sh --rehearse OUT   the --device flow here on CPU (local nsys, tiny sizes);
#                                      nothing it makes is a fixture
#   capture_modern.sh --device OUT     on a 1-GPU machine: unpack what travelled (.cap/), then
#                                      time each loop without a profiler (3 runs), and for each
#                                      capture `orch submit --wait`, `orch collect`,
#                                      `orch report --json`, then nsys's whole export of the
#                                      report `orch redact`ed; pack into OUT. CAPTURE_ONLY="A B"
#                                      makes only those; CAPTURE_TIMINGS=0 times only the compile
#                                      loop; TIMINGS_ONLY="A B" times only those, TIMINGS_FIRST=A
#                                      first (default the first of the set: it fills the caches);
#                                      TIMING_PROCESSES=N times each modern_loops.py loop in N
#                                      processes of one run each, every step's time printed
#   capture_modern.sh --bundle         here, before a device call: .cap/ as --device unpacks it
#                                      (wheels.tar.xz: one folder per wheel of
#                                      scripts/device_bundle.sh, unzipped; libs/: libdw and libelf
#                                      for the nsys inside Nsight Compute). Untracked, it travels
#                                      with the working tree; delete it after
#   capture_modern.sh --fixtures SRC DEST
#                                      unpack SRC/fx*.tar into DEST as committed fixtures (the
#                                      OS-runtime rows of threads that never touch CUDA dropped,
#                                      VACUUM, xz -9: tests/fixtures/README.md)
#
# The torch.compile timing run goes first: it fills Inductor's on-disk caches, so the captured
# runs replay cached kernels instead of compiling under the profiler.
# CAPTURE_SET=loops makes the loop-marks set instead (tests/fixtures/loops/): loops with no NVTX
# of their own, as orch's marks see them (a plain loop with fused AdamW and 4 micro-batches, its
# twin with profile.loop_marks: false, a dataset tokenising in the loop thread, the HF Trainer
# with accumulation and with the slow dataset, a small GPT whose loop thread masks every batch in
# Python: orch's Python samples name the function), each slow input timed at 0 and 8 workers, the
# masking loop with and without its masking, the same GPT under Lightning and in an Accelerate loop
# with accumulation, compiled with CUDA graphs at 0 and 4 DataLoader workers (its timing first:
# it fills Inductor's caches), the eager GPT saving a checkpoint (model and AdamW state, from
# the loop) every 5 and every 10 steps, timed with and without, and the eager GPT over a dataset of
# 8 steps an epoch with 4 DataLoader workers, which start anew every epoch without
# persistent_workers, timed with and without, and the HF Trainer over a dataset of 4 steps an
# epoch with 4 workers, with its own default dataloader_persistent_workers=False and with True, and
# the GPT compiled with CUDA graphs over documents of 32 to 256 tokens, each batch padded to its
# longest (a new shape, so a new graph, at most steps) and its twin padded to a multiple of 64.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=${1:?usage: $0 --bundle | --rehearse OUT | --device OUT | --fixtures SRC DEST}
shift

# name | profile lines (YAML, under profile:) | args on the GPU | tiny args (CPU) | script
# (default modern_loops.py)
GPT_TINY="--dim 64 --layers 2 --heads 2 --seq 32 --vocab 100 --batch 4 --device cpu"
HF_TINY="--tiny --seq 64 --batch 2"
MASK="--mask --layers 2 --dim 256 --heads 4 --batch 32 --seq 512 --workers 2"  # a small GPT, masking in the loop
EPOCHS="--epoch-steps 8 --workers 4 --steps 40"  # a dataset of 8 steps an epoch, 4 DataLoader workers
HF_EPOCHS="--accum 1 --steps 24 --workers 4 --epoch-steps 4"  # the Trainer over 4-step epochs, 4 workers
VARLEN="--compile reduce-overhead --min-seq 32 --steps 40"  # documents of 32-256 tokens, padded per batch
LOOP_CAPTURES=(
  "loops_fused_accum4||--accum 4 --steps 20 --fused|--accum 4 --steps 5 $GPT_TINY"
  "loops_fused_accum4_nomarks|loop_marks: false|--accum 4 --steps 20 --fused|--accum 4 --steps 5 $GPT_TINY"
  "loops_tokenise_w0||--sample-ms 5 --workers 0 --steps 20|--sample-ms 2 --steps 5 $GPT_TINY"
  "loops_tokenise_w2||--sample-ms 5 --workers 2 --steps 20|--sample-ms 2 --workers 2 --steps 5 $GPT_TINY"
  "loops_tokenise_w8||--sample-ms 5 --workers 8 --steps 20|--sample-ms 2 --workers 2 --steps 5 $GPT_TINY"
  "hf_gpt2_accum4||--accum 4 --steps 20 --workers 2|--accum 2 --steps 4 --workers 2 $HF_TINY|hf_trainer.py"
  "hf_gpt2_tokenise_w0||--accum 1 --steps 20 --workers 0 --sample-ms 5|--accum 1 --steps 4 --workers 0 --sample-ms 2 $HF_TINY|hf_trainer.py"
  "loops_mask||$MASK --steps 100|--mask --steps 5 $GPT_TINY"
  "lightning_gpt_accum4||--accum 4 --steps 20 --workers 2|--accum 2 --steps 4 --workers 0 ${GPT_TINY% --device cpu}|lightning_gpt.py"
  "accelerate_gpt_accum4||--accum 4 --steps 20 --workers 2|--accum 2 --steps 4 --workers 0 ${GPT_TINY% --device cpu}|accelerate_gpt.py"
  "loops_compile_ro||--compile reduce-overhead --steps 40|--compile default --steps 8 $GPT_TINY"
  "loops_compile_ro_w4||--compile reduce-overhead --steps 40 --workers 4|--compile default --steps 8 --workers 2 $GPT_TINY"
  "loops_ckpt5||--ckpt-every 5 --steps 40 --workers 2|--ckpt-every 2 --steps 6 $GPT_TINY"
  "loops_ckpt10||--ckpt-every 10 --steps 40 --workers 2|--ckpt-every 3 --steps 6 $GPT_TINY"
  "loops_epochs_np||$EPOCHS --no-persistent|--epoch-steps 2 --no-persistent --workers 2 --steps 6 $GPT_TINY"
  "loops_epochs_p||$EPOCHS|--epoch-steps 2 --workers 2 --steps 6 $GPT_TINY"
  "hf_epochs_np||$HF_EPOCHS --no-persistent|--accum 1 --steps 6 --workers 2 --epoch-steps 2 --no-persistent $HF_TINY|hf_trainer.py"
  "hf_epochs_p||$HF_EPOCHS|--accum 1 --steps 6 --workers 2 --epoch-steps 2 $HF_TINY|hf_trainer.py"
  "loops_varlen_ro||$VARLEN|--compile default --steps 8 --min-seq 8 $GPT_TINY"
  "loops_varlen_ro_pad64||$VARLEN --pad-to 64|--compile default --steps 8 --min-seq 8 --pad-to 16 $GPT_TINY"
  "hf_fp16||--accum 1 --steps 30 --workers 2 --fp16|--accum 1 --steps 6 --workers 2 --fp16 $HF_TINY|hf_trainer.py"
  "hf_fp16_accum4||--accum 4 --steps 20 --workers 2 --fp16|--accum 2 --steps 4 --workers 2 --fp16 $HF_TINY|hf_trainer.py"
)
# Loops timed without a profiler (name | args | script): each `--repeat 3` in one process.
LOOP_TIMINGS=(
  "loops_compile_ro|--compile reduce-overhead"
  "loops_compile_ro_w4|--compile reduce-overhead --workers 4"
  "loops_tokenise_w0|--sample-ms 5 --workers 0 --steps 20"
  "loops_tokenise_w8|--sample-ms 5 --workers 8 --steps 20"
  "loops_tokenise_w2|--sample-ms 5 --workers 2 --steps 20"
  # (6 and 7 workers: around the count orch's data-loader fix names for loops_tokenise_w2)
  "loops_tokenise_w6|--sample-ms 5 --workers 6 --steps 20"
  "loops_tokenise_w7|--sample-ms 5 --workers 7 --steps 20"
  "loops_fused_accum4|--accum 4 --steps 20 --fused"
  "hf_tokenise_w0|--accum 1 --steps 20 --workers 0 --sample-ms 5|hf_trainer.py"
  "hf_tokenise_w8|--accum 1 --steps 20 --workers 8 --sample-ms 5|hf_trainer.py"
  "loops_mask|$MASK --steps 100"
  "loops_nomask|${MASK#--mask } --steps 100"
  "lightning_gpt_accum4|--accum 4 --steps 20 --workers 2|lightning_gpt.py"
  "loops_ckpt5|--ckpt-every 5 --steps 40 --workers 2"
  "loops_ckpt10|--ckpt-every 10 --steps 40 --workers 2"
  "loops_nockpt|--steps 40 --workers 2"
  "loops_epochs_np|$EPOCHS --no-persistent"
  "loops_epochs_p|$EPOCHS"
  "hf_epochs_np|$HF_EPOCHS --no-persistent|hf_trainer.py"
  "hf_epochs_p|$HF_EPOCHS|hf_trainer.py"
  "loops_varlen_ro|$VARLEN"
  "loops_varlen_ro_pad64|$VARLEN --pad-to 64"
  "hf_fp16|--accum 1 --steps 30 --workers 2 --fp16|hf_trainer.py"
  "hf_bf16|--accum 1 --steps 30 --workers 2|hf_trainer.py"
)
CAPTURES=(
  "gpt_compile_ro_graphtrace|cuda_graph_trace: graph|--compile reduce-overhead|--compile default --steps 8 $GPT_TINY"
  "gpt_compile_ro_nodetrace|cuda_graph_trace: node|--compile reduce-overhead|--compile default --steps 8 $GPT_TINY"
  "gpt_eager_memusage|cuda_memory_usage: true||--steps 8 $GPT_TINY"
  "gpt_eager_emptycache_memusage|cuda_memory_usage: true|--empty-cache|--steps 8 $GPT_TINY"
  "gpt_eager_keepoutputs_memusage|cuda_memory_usage: true|--keep-outputs|--keep-outputs --steps 8 $GPT_TINY"
  "resnet18_pageable_nvtx||--model resnet --no-pin --workers 2 --batch 64 --steps 30 --nvtx|--steps 6 --accum 1 $GPT_TINY --nvtx"
  "gpt_eager_accum4||--accum 4 --steps 20|--accum 4 --steps 5 $GPT_TINY"
  "gpt_eager_nvtx||--nvtx|--nvtx --steps 8 $GPT_TINY"
)
# Loops timed without a profiler (name | args): each `--repeat 3` in one process.
TIMINGS=(
  "gpt_compile_ro|--compile reduce-overhead"
  "gpt_eager|"
  "gpt_eager_emptycache|--empty-cache"
  "gpt_eager_keepoutputs|--keep-outputs"
  "resnet18_pageable|--model resnet --no-pin --workers 2 --batch 64 --steps 30"
  "gpt_eager_accum4|--accum 4 --steps 20"
)
TIMINGS_AFTER=gpt_eager_accum4  # the capture after which the other timings run
# CAPTURE_SET=graphs: a launch-only fix measured as a pair in one call (tests/fixtures/graphs/):
# the eager GPT with NVTX steps, and the same step captured whole in one CUDA graph (the same
# kernels, nothing fused), each timed without a profiler too.
GRAPH_CAPTURES=(
  "gpt_eager_nvtx||--nvtx|--nvtx --steps 8 $GPT_TINY"
  "gpt_eager_graphed_nvtx||--cuda-graph --nvtx|--cuda-graph --nvtx --steps 8 $GPT_TINY"
)
GRAPH_TIMINGS=(
  "gpt_eager_graphed|--cuda-graph"
  "gpt_eager|"
)
# CAPTURE_SET=syncs: a host sync in every step as most loops write one (`print(f"... {loss.item()}")`
# each step, --log-every 1) against the same loop logging every 10 steps, on the eager GPT at batch
# 32 (its CPU's launches and its GPU's work a step about even) and on ResNet-18 at batch 64 (the
# GPU the slower), each pair timed without a profiler too.
SYNC_LOOP="--batch 32 --workers 2 --steps 40"
SYNC_RESNET="--model resnet --batch 64 --workers 4 --steps 30"
SYNC_CAPTURES=(
  "loops_logstep_b32||--log-every 1 $SYNC_LOOP|--log-every 1 --steps 6 $GPT_TINY"
  "loops_log10_b32||--log-every 10 $SYNC_LOOP|--log-every 3 --steps 6 $GPT_TINY"
  "resnet18_logstep||--log-every 1 $SYNC_RESNET|--log-every 1 --steps 6 $GPT_TINY"
  "resnet18_log10||--log-every 10 $SYNC_RESNET|--log-every 3 --steps 6 $GPT_TINY"
)
SYNC_TIMINGS=(
  "loops_logstep_b32|--log-every 1 $SYNC_LOOP"
  "loops_log10_b32|--log-every 10 $SYNC_LOOP"
  "resnet18_logstep|--log-every 1 $SYNC_RESNET"
  "resnet18_log10|--log-every 10 $SYNC_RESNET"
)
# CAPTURE_SET=inputs: a one-GPU loop waiting for its input as an image pipeline makes it wait,
# ResNet-18 at batch 64 whose dataset spends time in Python on each image (JPEG decoding and
# augmentation in __getitem__): 0.75 ms an image with 2 DataLoader workers, 0.25 ms in the loop
# thread itself (num_workers=0), each against the same dataset with 8 workers, which keep up;
# each pair timed without a profiler too.
INPUT_RESNET="--model resnet --batch 64 --steps 30"
INPUT_CAPTURES=(
  "resnet18_decode_w2||--workers 2 --sample-ms 0.75 $INPUT_RESNET|--workers 2 --sample-ms 1 --steps 6 $GPT_TINY"
  "resnet18_decode_w8||--workers 8 --sample-ms 0.75 $INPUT_RESNET|--workers 2 --steps 6 $GPT_TINY"
  "resnet18_decode_w0||--workers 0 --sample-ms 0.25 $INPUT_RESNET|--sample-ms 1 --steps 6 $GPT_TINY"
  "resnet18_decode_w0_w8||--workers 8 --sample-ms 0.25 $INPUT_RESNET|--workers 2 --steps 6 $GPT_TINY"
)
INPUT_TIMINGS=(
  "resnet18_decode_w2|--workers 2 --sample-ms 0.75 $INPUT_RESNET"
  "resnet18_decode_w8|--workers 8 --sample-ms 0.75 $INPUT_RESNET"
  "resnet18_decode_w0|--workers 0 --sample-ms 0.25 $INPUT_RESNET"
  "resnet18_decode_w0_w8|--workers 8 --sample-ms 0.25 $INPUT_RESNET"
)
# CAPTURE_SET=compiled: the GPT compiled as most code compiles it, torch.compile(model) with
# Inductor's default mode, at batch 4 (its kernels small, so its launches bound it), against the
# same loop compiled with CUDA graphs (mode="reduce-overhead", the fix the launch-bound finding
# names), and compiled with a graph break in every block; each timed without a profiler too. The
# default loop's timing goes first and each other's before its capture: each fills Inductor's
# caches for its own graphs, so the captures replay cached kernels.
COMPILED="--batch 4 --steps 40"
COMPILED_CAPTURES=(
  "gpt_compile_default_b4||--compile default $COMPILED|--compile default --steps 6 $GPT_TINY"
  "gpt_compile_ro_b4||--compile reduce-overhead $COMPILED|--compile default --steps 6 $GPT_TINY"
  "gpt_compile_breaks_b4||--compile default --graph-break $COMPILED|--compile default --graph-break --steps 6 $GPT_TINY"
)
COMPILED_TIMINGS=(
  "gpt_compile_default_b4|--compile default $COMPILED"
  "gpt_compile_ro_b4|--compile reduce-overhead $COMPILED"
  "gpt_compile_breaks_b4|--compile default --graph-break $COMPILED"
)
# CAPTURE_SET=hfcompiled: the HF Trainer's own torch.compile (TrainingArguments(torch_compile=True))
# of GPT-2 small at batch 2 x 256 tokens, with Inductor's default mode and with
# torch_compile_mode="reduce-overhead" (CUDA graphs); each timed without a profiler too, its timing
# before its capture (which fills Inductor's caches for it).
HFC="--accum 1 --steps 30 --workers 2 --batch 2 --seq 256"
HFC_CAPTURES=(
  "hf_gpt2_compile_b2||--compile default $HFC|--compile default --accum 1 --steps 4 --workers 0 $HF_TINY|hf_trainer.py"
  "hf_gpt2_compile_ro_b2||--compile reduce-overhead $HFC|--compile default --accum 1 --steps 4 --workers 0 $HF_TINY|hf_trainer.py"
)
HFC_TIMINGS=(
  "hf_gpt2_compile_b2|--compile default $HFC|hf_trainer.py"
  "hf_gpt2_compile_ro_b2|--compile reduce-overhead $HFC|hf_trainer.py"
)
# CAPTURE_SET=copies: ResNet-18 at batch 64 with 2 DataLoader workers whose batches come from
# pageable memory (DataLoader(pin_memory=False), a blocking .to(device), as code that leaves
# pin_memory at its default writes it) against the same loop with pinned batches and
# non_blocking copies (the fix the pageable-copy finding names); each timed without a profiler too.
COPY_RESNET="--model resnet --workers 2 --batch 64 --steps 30"
COPY_CAPTURES=(
  "resnet18_nopin_w2||--no-pin $COPY_RESNET|--no-pin --steps 6 $GPT_TINY"
  "resnet18_pin_w2||$COPY_RESNET|--steps 6 $GPT_TINY"
)
COPY_TIMINGS=(
  "resnet18_nopin_w2|--no-pin $COPY_RESNET"
  "resnet18_pin_w2|$COPY_RESNET"
)
REHEARSE=0
if [ "${CAPTURE_SET:-modern}" = inputs ]; then
  CAPTURES=("${INPUT_CAPTURES[@]}")
  TIMINGS=("${INPUT_TIMINGS[@]}")
  TIMINGS_AFTER=resnet18_decode_w2
elif [ "${CAPTURE_SET:-modern}" = copies ]; then
  CAPTURES=("${COPY_CAPTURES[@]}")
  TIMINGS=("${COPY_TIMINGS[@]}")
  TIMINGS_AFTER=resnet18_nopin_w2
elif [ "${CAPTURE_SET:-modern}" = hfcompiled ]; then
  CAPTURES=("${HFC_CAPTURES[@]}")
  TIMINGS=("${HFC_TIMINGS[@]}")
  TIMINGS_AFTER=hf_gpt2_compile_b2
elif [ "${CAPTURE_SET:-modern}" = compiled ]; then
  CAPTURES=("${COMPILED_CAPTURES[@]}")
  TIMINGS=("${COMPILED_TIMINGS[@]}")
  TIMINGS_AFTER=gpt_compile_default_b4
elif [ "${CAPTURE_SET:-modern}" = syncs ]; then
  CAPTURES=("${SYNC_CAPTURES[@]}")
  TIMINGS=("${SYNC_TIMINGS[@]}")
  TIMINGS_AFTER=resnet18_logstep
elif [ "${CAPTURE_SET:-modern}" = loops ]; then
  CAPTURES=("${LOOP_CAPTURES[@]}")
  TIMINGS=("${LOOP_TIMINGS[@]}")
  TIMINGS_AFTER=${TIMINGS_AFTER_LOOPS:-hf_gpt2_tokenise_w0}
elif [ "${CAPTURE_SET:-modern}" = graphs ]; then
  CAPTURES=("${GRAPH_CAPTURES[@]}")
  TIMINGS=("${GRAPH_TIMINGS[@]}")
  TIMINGS_AFTER=gpt_eager_graphed_nvtx
fi

wanted() {  # wanted NAME LIST: LIST empty, or NAME in it (CAPTURE_ONLY, TIMINGS_ONLY)
  [ -z "$2" ] || [[ " $2 " == *" $1 "* ]]
}

field() {  # field ROW INDEX
  local f
  IFS='|' read -r -a f <<<"$1"
  printf '%s' "${f[$2]:-}"
}

device_setup() {  # unpacks the wheels and orch into /tmp/site; sets NSYS
  rm -rf /tmp/site && mkdir -p /tmp/site
  python3 - "$repo/.cap/wheels.tar.xz" <<'EOF'
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as t:  # one folder per wheel: its contents are the installed package
    t.extractall("/tmp/wheels")
for w in os.listdir("/tmp/wheels"):
    os.system(f"cp -r /tmp/wheels/{w}/. /tmp/site/")
EOF
  # typing_extensions travels only for an image older than what pydantic needs.
  python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir --target /tmp/site-orch "$repo"
  cp -r /tmp/site-orch/. /tmp/site/
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  local h=/opt/nvidia/nsight-compute/2025.3.1/host
  ln -sfn "$h/linux-desktop-glibc_2_11_3-x64" "$h/host-linux-x64"
  cp "$repo"/.cap/libs/libdw.so.1 "$repo"/.cap/libs/libelf.so.1 "$h/linux-desktop-glibc_2_11_3-x64/"
  NSYS=$h/target-linux-x64/nsys
  "$NSYS" --version
  orch --help >/dev/null
}

write_config() {  # write_config DIR NSYS VERSION GPU
  mkdir -p "$1/clusters"
  cat >"$1/clusters/gpu1.yaml" <<EOF
name: gpu1
executor: local
gpu: {model: "$4", per_node: 1}
nsys: {path: "$2", version: "$3"}
python: python3
env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1", PYTHONUNBUFFERED: "1"}
EOF
}

write_spec() {  # write_spec FILE ROW
  local row=$2 args="" a extra script
  script=$(field "$row" 4)
  for a in $(field "$row" $((2 + REHEARSE))); do args+="\"$a\", "; done
  extra=$(field "$row" 1)
  cat >"$1" <<EOF
name: $(field "$row" 0)
cluster: gpu1
slurm: {time: "00:04:00"}
launch:
  script: $here/${script:-modern_loops.py}
  args: [${args%, }]
  nproc_per_node: 1
layout: {tp: 1, pp: 1, dp: 1}
profile:
  ranks: all
  trace: [cuda, nvtx, osrt]
  sample: none
  cpuctxsw: none
  python_sampling_ms: 10
  ${extra}
EOF
}

capture_one() {  # capture_one WORK ROW
  local work=$1 row=$2 name job run t0=$SECONDS
  name=$(field "$row" 0)
  echo "== $name at ${SECONDS}s: $(field "$row" $((2 + REHEARSE))) [$(field "$row" 1)]"
  write_spec "$work/specs/$name.yaml" "$row"
  if ! timeout 200 orch submit "$work/specs/$name.yaml" --wait --timeout 190 >"$work/logs/$name.submit.log" 2>&1; then
    cat "$work/logs/$name.submit.log"
    tail -n 60 "$ORCH_RUNS"/"$name"-*/submitit/*_0_log.err 2>/dev/null || true
    echo "$name: FAILED submit/run after $((SECONDS - t0))s" | tee "$work/status/$name"
    return 0
  fi
  job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/logs/$name.submit.log" | head -n 1)
  run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$ORCH_RUNS"/*/manifest.json | head -n 1)")
  tail -n 4 "$run"/submitit/*_0_log.out 2>/dev/null || true
  cp "$run"/submitit/*_0_log.out "$work/logs/$name.stdout" 2>/dev/null || true
  orch collect "$job" >"$work/logs/$name.collect.log" 2>&1 || { echo "$name: FAILED collect" | tee "$work/status/$name"; return 0; }
  orch report "$job" --json "$work/reports/$name.json" >"$work/reports/$name.txt" 2>&1 || echo "$name: report exit $?"
  head -n 40 "$work/reports/$name.txt"
  mkdir -p "$work/redacted/$name" "$work/fx/$name" "$work/full/$name"
  # The fixture is nsys's whole export, not orch's (orch exports only the tables it reads
  # today): tests and other analyses need every table the capture holds.
  local rep
  for rep in "$run"/reports/*.nsys-rep; do
    "$NSYS" export --type sqlite --force-overwrite true --include-json true \
      -o "$work/full/$name/$(basename "$rep" .nsys-rep).sqlite" "$rep" >/dev/null 2>&1 \
      || "$NSYS" export --type sqlite --force-overwrite true \
        -o "$work/full/$name/$(basename "$rep" .nsys-rep).sqlite" "$rep" >/dev/null
  done
  orch redact "$work/full/$name"/*.sqlite -o "$work/redacted/$name"
  local f
  for f in "$work/redacted/$name"/*.sqlite.gz; do  # drop the job id: NAME_r<rank>_<host>.<pid>
    mv "$f" "$work/fx/$name/$(basename "$f" | sed "s/^${name}_${job}_/${name}_/")"
  done
  cp "$run/manifest.json" "$work/reports/$name.manifest.json"
  echo "$name: OK job $job in $((SECONDS - t0))s, $(du -b "$work/fx/$name"/* | awk '{s+=$1} END {print s}') bytes" | tee "$work/status/$name"
}

time_one() {  # time_one WORK ROW: the loop without a profiler, 3 runs in one process
  local name args script
  name=$(field "$2" 0)
  args=$(field "$2" 1)
  script=$(field "$2" 2)
  [ "$REHEARSE" = 1 ] && args="--steps 8 $GPT_TINY"
  [ "$REHEARSE" = 1 ] && [ -n "$script" ] && args="--steps 6 $HF_TINY"
  echo "== timing $name at ${SECONDS}s"
  if [ -n "${TIMING_PROCESSES:-}" ] && [ -z "$script" ]; then
    # one run a process, each step's time too: the first fills the compile caches, as the
    # timings before a capture do, and the later ones start as warm as the capture
    local i
    for i in $(seq "$TIMING_PROCESSES"); do
      # shellcheck disable=SC2086
      (cd "$here" && timeout 240 python3 modern_loops.py $args --repeat 1 --step-ms) >"$1/timings/$name.p$i.log" 2>&1 \
        || echo "timing $name process $i: exit $?"
      grep -E '^(steady step ms per run|step ms)' "$1/timings/$name.p$i.log" | sed "s/^/$name p$i: /" \
        | tee -a "$1/timings/_summary"
    done
    return 0
  fi
  # shellcheck disable=SC2086
  (cd "$here" && timeout 240 python3 "${script:-modern_loops.py}" $args --repeat 3) >"$1/timings/$name.log" 2>&1 \
    || echo "timing $name: exit $?"
  grep -E '^(steady|mask_tokens|save_checkpoint)' "$1/timings/$name.log" | sed "s/^/$name: /" | tee -a "$1/timings/_summary"
}

cpu_shim() {  # CPU runs only: torch.cuda.nvtx needs a CUDA build of torch; make it a no-op
  local shim
  shim=$(mktemp -d /tmp/orch-cpu-shim.XXXXXX)
  cat >"$shim/sitecustomize.py" <<'EOF'
import contextlib
import torch
if not torch.cuda.is_available():
    import torch.cuda.nvtx as _nvtx
    _nvtx.range = lambda *a, **k: contextlib.nullcontext()
EOF
  export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
}

device_run() {
  local out deadline=${CAPTURE_DEADLINE_S:-540} row
  out=$(realpath -m "$1")
  mkdir -p "$out"
  if [ "$REHEARSE" = 0 ]; then
    device_setup
  else
    NSYS=${NSYS:-/usr/lib/nsight-systems/target-linux-x64/nsys}
    cpu_shim
  fi
  local work=/tmp/orch-modern
  rm -rf "$work" && mkdir -p "$work"/{logs,status,reports,redacted,fx,specs,timings}
  export ORCH_CLUSTER_DIR=$work/specs/clusters ORCH_RUNS=$work/runs PYTHONUNBUFFERED=1
  local gpu ver
  gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")')
  ver=$("$NSYS" --version | grep -oE '[0-9]{4}\.[0-9]+(\.[0-9]+)?' | head -n 1)
  {
    [ "$REHEARSE" = 1 ] && echo "REHEARSAL on CPU (tiny sizes): not a capture to keep"
    echo "gpu: $gpu; nsys: $ver ($NSYS)"
    python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' 2>&1 || true
    python3 -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>&1 || true
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    lscpu | grep -E 'Model name|^CPU\(s\)' || true
    echo "orch: working tree at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?') + uncommitted edits"
  } | tee "$work/status/_env"
  write_config "$work/specs" "$NSYS" "$ver" "$gpu"
  local first=${TIMINGS_FIRST:-$(field "${TIMINGS[0]}" 0)} t
  for t in "${TIMINGS[@]}"; do  # fills the compile caches first
    if [ "$(field "$t" 0)" = "$first" ] && wanted "$first" "${TIMINGS_ONLY:-}"; then time_one "$work" "$t"; fi
  done
  for row in "${CAPTURES[@]}"; do
    if [ -n "${CAPTURE_ONLY:-}" ] && [[ " $CAPTURE_ONLY " != *" $(field "$row" 0) "* ]]; then continue; fi
    if [ $((SECONDS + 60)) -gt "$deadline" ]; then
      echo "SKIPPED (deadline, ${SECONDS}s used): $(field "$row" 0)" | tee -a "$work/status/_skipped"
      continue
    fi
    capture_one "$work" "$row"
    if [ "$(field "$row" 0)" = "$TIMINGS_AFTER" ] && [ "${CAPTURE_TIMINGS:-1}" = 1 ]; then
      # the other timings before the last capture
      for t in "${TIMINGS[@]}"; do
        [ $((SECONDS + 30)) -gt "$deadline" ] && break
        [ "$(field "$t" 0)" = "$first" ] && continue
        wanted "$(field "$t" 0)" "${TIMINGS_ONLY:-}" || continue
        time_one "$work" "$t"
      done
    fi
    pack "$work" "$out"
  done
  cat "$work"/status/* "$work"/timings/_summary 2>/dev/null || true
  pack "$work" "$out"
  ls -la "$out"
}

pack() {  # pack WORK OUT: every export in one tar per <= 15.5 MiB, the rest in one tgz
  local work=$1 out=$2
  python3 - "$work" "$out" <<'EOF'
import os, sys, tarfile
work, out = sys.argv[1:]
files = sorted((os.path.getsize(os.path.join(work, "fx", n, f)), f"{n}/{f}")
               for n in os.listdir(f"{work}/fx") for f in os.listdir(f"{work}/fx/{n}"))
cap, bins = int(15.5 * 2**20), []
for size, arc in sorted(files, reverse=True):
    for b in bins:
        if b[0] + size + 4096 <= cap:
            b[0] += size + 4096; b[1].append(arc); break
    else:
        bins.append([size + 4096, [arc]])
for i, b in enumerate(bins[:6]):
    with tarfile.open(f"{out}/.fx{i}.tmp", "w") as t:
        for arc in sorted(b[1]):
            t.add(os.path.join(work, "fx", arc), arcname=arc)
    os.replace(f"{out}/.fx{i}.tmp", f"{out}/fx{i}.tar")
EOF
  tar -czf "$out/.reports.tmp" -C "$work" reports logs status specs timings && mv "$out/.reports.tmp" "$out/reports.tar.gz"
}

make_fixtures() {  # make_fixtures SRC DEST
  local src=$1 dest=$2 tmp
  tmp=$(mktemp -d /tmp/orch-modern-fx.XXXXXX)
  mkdir -p "$dest"
  for t in "$src"/fx*.tar; do tar -xf "$t" -C "$tmp"; done
  python3 - "$tmp" "$dest" <<'EOF'
import gzip, lzma, os, shutil, sqlite3, sys
tmp, dest = sys.argv[1:]
# OS-runtime rows of threads with no CUDA API call (Inductor's compile workers, DataLoader
# pin/worker polling, c10d's TCPStore) are dropped; the loop thread's rows stay whole.
print("file\tosrt_rows\tosrt_rows_removed\txz_bytes")
for cap in sorted(os.listdir(tmp)):
    for f in sorted(os.listdir(os.path.join(tmp, cap))):
        plain = os.path.join(tmp, f[:-3])
        with gzip.open(os.path.join(tmp, cap, f)) as a, open(plain, "wb") as b:
            shutil.copyfileobj(a, b)
        con = sqlite3.connect(plain)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        n_osrt = n_del = 0
        if "OSRT_API" in tables and "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            n_osrt = con.execute("SELECT count(*) FROM OSRT_API").fetchone()[0]
            n_del = con.execute("DELETE FROM OSRT_API WHERE globalTid NOT IN "
                                "(SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME)").rowcount
            if "OSRT_CALLCHAINS" in tables:
                con.execute("DELETE FROM OSRT_CALLCHAINS WHERE id NOT IN (SELECT callchainId FROM OSRT_API)")
        con.commit()
        con.execute("VACUUM")
        con.close()
        out = os.path.join(dest, f[:-3] + ".xz")
        with open(plain, "rb") as a, lzma.open(out, "wb", preset=9) as b:
            shutil.copyfileobj(a, b)
        os.unlink(plain)
        print(f"{f}\t{n_osrt}\t{n_del}\t{os.path.getsize(out)}")
EOF
  rm -rf "$tmp"
}

bundle() {  # .cap/ from scripts/device_bundle.sh's wheels and debs (orch itself installs from the tree)
  local tmp w
  tmp=$(mktemp -d /tmp/orch-cap.XXXXXX)
  bash "$repo/scripts/device_bundle.sh" "$tmp/b" >/dev/null
  mkdir -p "$tmp/w" "$tmp/deb" "$repo/.cap/libs"
  for w in "$tmp"/b/wheels/*.whl; do
    case $(basename "$w") in orch-*) continue ;; esac
    mkdir -p "$tmp/w/$(basename "$w" .whl)"
    python3 -m zipfile -e "$w" "$tmp/w/$(basename "$w" .whl)"
  done
  for w in "$tmp"/b/debs/*.deb; do dpkg-deb -x "$w" "$tmp/deb"; done
  cp -L "$tmp"/deb/usr/lib/x86_64-linux-gnu/{libdw.so.1,libelf.so.1} "$repo/.cap/libs/"
  tar -C "$tmp/w" -cJf "$repo/.cap/wheels.tar.xz" .
  rm -rf "$tmp"
  du -sh "$repo/.cap"
}

case $mode in
  --bundle) bundle ;;
  --device) device_run "${1:?--device OUT}" ;;
  --rehearse) REHEARSE=1 CAPTURE_DEADLINE_S=${CAPTURE_DEADLINE_S:-3000} device_run "${1:?--rehearse OUT}" ;;
  --fixtures) make_fixtures "$(realpath -m "${1:?--fixtures SRC DEST}")" "$(realpath -m "${2:?--fixtures SRC DEST}")" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
