#!/usr/bin/env bash
# Communication captures with known message sizes: the ground truth in tests/fixtures/comm/.
#
#   capture_comm.sh --device OUT     on the 2-GPU machine: nsys 2025.3 from the Nsight Compute
#                                    image (libs in .cap/libs), one nsys per rank under torchrun
#                                    (as orch's rank wrapper does), captures
#                                      nvlink  comm_bench.py sweep (NCCL over NVLink)
#                                      socket  the same with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
#                                              (NCCL's socket transport over loopback: the slow link)
#                                      ddp     comm_bench.py ddp (bucket_cap_mb 8)
#                                    then `nsys export --type sqlite` with every payload option the
#                                    exporter offers, gzip; OUT gets one tar per capture + info.tar.gz
#   capture_comm.sh --rehearse OUT   the same here on CPU (gloo, nsys 2022.4, sizes / 4096)
#
# NVLink multicast stays off in every process.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mode=${1:?usage: $0 --device OUT | --rehearse OUT}
out=$(realpath -m "${2:?OUT}")
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
work=/tmp/capcomm
rm -rf "$work" && mkdir -p "$work/info"
info=$work/info

if [ "$mode" = --device ]; then
  h=/opt/nvidia/nsight-compute/2025.3.1/host
  ln -sfn "$h/linux-desktop-glibc_2_11_3-x64" "$h/host-linux-x64"
  cp "$here/libs/libdw.so.1" "$here/libs/libelf.so.1" "$h/linux-desktop-glibc_2_11_3-x64/"
  NSYS=$h/target-linux-x64/nsys
  SCALE=1 PYT="--pytorch=autograd-shapes-nvtx"
else
  NSYS=${NSYS:-nsys}
  SCALE=4096 PYT=""
fi
{
  "$NSYS" --version
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", "gpus", torch.cuda.device_count())'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  nvidia-smi nvlink -s 2>&1 | head -n 40
  ip -brief addr 2>&1 | head
} >"$info/env.txt" 2>&1
"$NSYS" profile --help >"$info/nsys_profile_help.txt" 2>&1
"$NSYS" export --help >"$info/nsys_export_help.txt" 2>&1
cat "$info/env.txt"
grep -n -i -E 'nccl|pytorch|payload|json|blob' "$info/nsys_profile_help.txt" "$info/nsys_export_help.txt" | head -n 40
# Every exporter option that adds NVTX payloads (names differ between nsys versions).
EXPORT_OPTS=()
for o in include-json include-blobs; do
  grep -q -- "--$o" "$info/nsys_export_help.txt" && EXPORT_OPTS+=("--$o=true")
done
echo "export options: ${EXPORT_OPTS[*]:-none}" | tee "$info/export_opts.txt"
# A trace option for NCCL, where this nsys has one.
TRACE=cuda,nvtx
if grep -q -E '^\s+nccl\b|[ ,]nccl[ ,]' "$info/nsys_profile_help.txt"; then TRACE=$TRACE,nccl; fi
[ -n "$PYT" ] && ! grep -q 'autograd-shapes-nvtx' "$info/nsys_profile_help.txt" && PYT=""
# Options this nsys rejects would lose the capture: try them on `true` first, drop what fails.
for try in "$TRACE|$PYT" "cuda,nvtx|$PYT" "cuda,nvtx|"; do
  TRACE=${try%%|*} PYT=${try#*|}
  # shellcheck disable=SC2086
  "$NSYS" profile -t "$TRACE" $PYT --sample=none --cpuctxsw=none --force-overwrite=true \
    -o "$work/probe" true >"$info/probe_$TRACE.log" 2>&1 && break
  echo "nsys rejected: -t $TRACE $PYT" | tee -a "$info/export_opts.txt"
done
echo "trace: $TRACE pytorch: ${PYT:-none}" | tee -a "$info/export_opts.txt"

cat >"$work/wrap.sh" <<EOF
#!/usr/bin/env bash
# one nsys per rank, named as orch's rank wrapper names reports: NAME_r<RANK>_<host>.<pid>
exec "$NSYS" profile -t $TRACE $PYT --sample=none --cpuctxsw=none --force-overwrite=true \\
  -o "\$CAP_DIR/\${CAP_NAME}_r\${RANK}_\$(hostname).\$\$" "\$@"
EOF
chmod +x "$work/wrap.sh"

capture() {  # capture NAME TIMEOUT ENV... -- ARGS...
  local name=$1 tmo=$2 t0=$SECONDS
  shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  mkdir -p "$work/$name"
  echo "== $name at ${SECONDS}s: ${envs[*]} $*"
  env "${envs[@]}" CAP_DIR="$work/$name" CAP_NAME="$name" timeout "$tmo" \
    torchrun --standalone --nproc_per_node 2 --no-python "$work/wrap.sh" \
    python3 "$here/comm_bench.py" "$@" --out "$work/$name" --scale "$SCALE" >"$work/$name/run.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0))s"
  tr '\r' '\n' <"$work/$name/run.log" | grep -v -E '^\[1/1\]|^W[0-9]{4}|FutureWarning|return func|^\s*$' | tail -n 40
  local r
  for r in "$work/$name"/*.nsys-rep; do
    [ -f "$r" ] || continue
    "$NSYS" export --type sqlite "${EXPORT_OPTS[@]}" --force-overwrite=true -o "${r%.nsys-rep}.sqlite" "$r" \
      >>"$work/$name/export.log" 2>&1 || { echo "export with ${EXPORT_OPTS[*]} failed: $r"; \
      "$NSYS" export --type sqlite --force-overwrite=true -o "${r%.nsys-rep}.sqlite" "$r" >>"$work/$name/export.log" 2>&1; }
    python3 - "${r%.nsys-rep}.sqlite" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
if not c.execute("SELECT count(*) FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone()[0]:
    sys.exit(print(sys.argv[1], "no NVTX_EVENTS"))
cols = [r[1] for r in c.execute("PRAGMA table_info(NVTX_EVENTS)")]
agg = "".join(f", count({x})" for x in ("jsonText", "jsonTextId", "binaryData", "uint64Value") if x in cols)
print(sys.argv[1].rsplit("/", 1)[-1], "NVTX rows/json/jsonId/binary/u64:", cols[-3:], c.execute(f"SELECT count(*){agg} FROM NVTX_EVENTS").fetchone())
q = ("SELECT coalesce(e.text, s.value), count(*), min(%s) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
     "WHERE e.domainId <> 0 AND e.eventType = 59 GROUP BY 1 ORDER BY 2 DESC LIMIT 8")
sel = "substr(coalesce(e.jsonText, hex(e.binaryData)), 1, 200)" if "jsonText" in cols else "NULL"
for row in c.execute(q % sel):
    print("   ", row)
for row in c.execute("SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                     "WHERE coalesce(e.text, s.value) LIKE '%comms%' OR coalesce(e.text, s.value) LIKE 'c10d%' LIMIT 4"):
    print("   ", row[0][:300])
PY
    gzip -6 -f "${r%.nsys-rep}.sqlite"
  done
  (cd "$work/$name" && tar -cf "$out/$name.tar" ./*.sqlite.gz truth_r*.json run.log export.log 2>/dev/null)
  ls -la "$out/$name.tar"
}

capture nvlink 120 NCCL_DEBUG=WARN -- sweep --steps 5
capture socket 170 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET -- sweep --steps 4
capture ddp 80 NCCL_DEBUG=WARN -- ddp --steps 8 --bucket-cap-mb 8
# The raw reports too (re-exportable with a newer nsys), where they fit.
(cd "$work" && tar -cf "$out/reps.tar" ./*/*.nsys-rep 2>/dev/null)
[ "$(stat -c %s "$out/reps.tar" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ] && rm -f "$out/reps.tar"
tar -czf "$out/info.tar.gz" -C "$work" info
ls -la "$out"
echo "total ${SECONDS}s"
