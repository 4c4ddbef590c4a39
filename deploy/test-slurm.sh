#!/usr/bin/env bash
# CI: deploy/slurm-array.sh on a real one-node Slurm cluster (Debian's slurm-wlm and munge, installed when missing;
# needs root). It starts munged, slurmctld and slurmd from a generated configuration in a temporary directory,
# then, on 200 images with a short threat model (deploy/threat-ci.json):
#   1. submits the array (2 shards, 1 CPU each) and its merge through deploy/slurm-array.sh, requeues shard 1
#      while it runs (Slurm kills it; it continues from its ledger), and checks that each task ran with 1 thread,
#      that shard 1 ran twice, and that the merged ledger equals the unsharded run's record for record
#      (everything but wall-clock seconds);
#   2. submits a second run, kills shard 1's process with SIGKILL, and checks that the merge job fails (rather than
#      waiting forever) naming shard 1 and printing the recovery command; runs that command and checks the result.
# Every wait is bounded; at the end, also on failure, it cancels its jobs and stops the daemons it started by their
# recorded PIDs. About a minute on 2 cores, plus the packages' installation the first time.
#   bash deploy/test-slurm.sh            (CARGO_TARGET_DIR is honoured; it builds the evaluate example itself)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$SECONDS
LIMIT=200
WAIT=${SLURM_TEST_WAIT:-300} # seconds any one wait may take

say() { printf '[test-slurm %3ds] %s\n' $((SECONDS - START)) "$*"; }
fail() { say "FAIL: $*"; exit 1; }

# --- Tools ---------------------------------------------------------------------------------------------------
missing=()
command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v jq >/dev/null 2>&1 || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "needs ${missing[*]} (apt-get install) or root to install them"
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$(id -u)" = 0 ] || fail "runs Slurm's daemons as root: run it as root"

say "building the evaluate example"
cargo build --release --example evaluate --quiet
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/examples/evaluate
case $BIN in /*) ;; *) BIN=$REPO/$BIN ;; esac

# --- A one-node cluster ----------------------------------------------------------------------------------------
W=$(mktemp -d /tmp/armoury-slurm.XXXXXX)
PIDS=()
cleanup() {
  local status=$?
  # Jobs first (stopping slurmd leaves running jobs running), then the daemons.
  if [ ${#PIDS[@]} -eq 3 ]; then
    local -a jobs=()
    read -r -a jobs <<<"$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')"
    [ ${#jobs[@]} -eq 0 ] || scancel --quiet "${jobs[@]}" 2>/dev/null || true
    for _ in $(seq 100); do squeue -h -o %A 2>/dev/null | grep -q . || break; sleep 0.2; done
  fi
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ $status -ne 0 ]; then
    for f in "$W"/log/*.log "$W"/data/runs/*/slurm/*.log; do
      [ -f "$f" ] && { echo "--- $f (tail)"; tail -n 15 "$f"; }
    done
  fi
  rm -rf "$W"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$W/munge" "$W/state" "$W/spool" "$W/log"
chmod 755 "$W/munge"
head -c 1024 /dev/urandom >"$W/munge/munge.key"
chmod 400 "$W/munge/munge.key"
munged --foreground --force --key-file="$W/munge/munge.key" --socket="$W/munge/munge.sock" \
  --pid-file="$W/munge/munged.pid" --seed-file="$W/munge/munged.seed" --log-file="$W/log/munged.log" >>"$W/log/munged.out" 2>&1 &
PIDS+=($!)

HOST=$(hostname -s)
NODE=$(slurmd -C | head -n 1) # NodeName=<host> CPUs=… RealMemory=…: this machine as Slurm sees it
PORT=$((20000 + RANDOM % 20000))
: >"$W/plugstack.conf"
cat >"$W/slurm.conf" <<EOF
ClusterName=armoury-ci
SlurmctldHost=$HOST
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge/munge.sock
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
PlugStackConfig=$W/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=600
$NODE State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$W/slurm.conf
for _ in $(seq 50); do [ -S "$W/munge/munge.sock" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" >>"$W/log/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" >>"$W/log/slurmd.out" 2>&1 &
PIDS+=($!)

# until SECONDS CONDITION…: polls the condition every 0.2 s, fails after SECONDS.
until_() {
  local limit=$1 t0=$SECONDS
  shift
  until "$@"; do
    [ $((SECONDS - t0)) -lt "$limit" ] || fail "timed out after ${limit}s waiting for: $*"
    sleep 0.2
  done
}
node_idle() { sinfo -h -o %t 2>/dev/null | grep -qx idle; }
until_ 60 node_idle
say "cluster up: $NODE"

# --- The shared data directory ---------------------------------------------------------------------------------
D=$W/data
mkdir -p "$D"
cp tests/fixtures/cnn.safetensors "$D/model.safetensors"
if [ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
  DATASET=/usr/share/datasets/fashion-mnist
else
  DATASET=sample # the embedded 1,000 test images
fi
FLAGS=(--no-audit)

# The unsharded reference.
say "unsharded run ($LIMIT images, data: $DATASET)"
RAYON_NUM_THREADS=2 timeout "$WAIT" "$BIN" --model "$D/model.safetensors" --data "$DATASET" --limit $LIMIT \
  --threat-model deploy/threat-ci.json --out "$W/full" "${FLAGS[@]}" >"$W/log/full.log" 2>&1 ||
  fail "the unsharded run failed: $(tail -n 3 "$W/log/full.log")"

submit() { # RUN: submits the 2-shard run D/runs/RUN, prints the array's job id
  BIN=$BIN bash deploy/slurm-array.sh --run "$1" --dataset "$DATASET" --threat-model deploy/threat-ci.json --cpus 1 \
    --mem 1G "$D" 2 $LIMIT -- "${FLAGS[@]}" >"$W/log/submit-$1.log" 2>&1 ||
    fail "submitting $1: $(cat "$W/log/submit-$1.log")"
  sed -n 's/^submitted array \([0-9]*\) .*/\1/p' "$W/log/submit-$1.log" | tail -n 1
}
merge_job() { sed -n 's/^submitted array .* and merge \([0-9]*\) .*/\1/p' "$W/log/submit-$1.log" | tail -n 1; }
state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1; }
running() { [ "$(state "$1")" = RUNNING ]; }
pending() { [ "$(state "$1")" = PENDING ]; }
jobid() { scontrol show job "$1" | sed -n 's/^JobId=\([0-9]*\) .*/\1/p' | head -n 1; } # of an array task
steps_done() { jq -r .steps_done "$1" 2>/dev/null || echo 0; }
has_progress() { [ "$(steps_done "$1")" -ge 1 ] 2>/dev/null; }
merge_ended() { ! squeue -h -n armoury-evaluate-merge -o %i | grep -q .; }
no_jobs() { ! squeue -h -o %i | grep -q .; }
same_ledger() { # A B: equal but for wall-clock seconds
  cmp -s <(jq -S 'del(.work[].seconds)' "$1") <(jq -S 'del(.work[].seconds)' "$2")
}

# --- 1. Requeue a running shard; the merge equals the unsharded run ---------------------------------------------
say "run a: array and merge through deploy/slurm-array.sh"
A=$(submit a)
R=$D/runs/a
until_ "$WAIT" running "${A}_1"
until_ "$WAIT" has_progress "$R/ledger-1-of-2.json"
say "run a: shard 1 at step $(steps_done "$R/ledger-1-of-2.json"): scontrol requeue ${A}_1"
scontrol requeue "${A}_1"
# Slurm holds a requeued job back for a while (its BeginTime) before it may start again: let it start now.
until_ "$WAIT" pending "${A}_1"
out=$(scontrol update JobId="${A}_1" StartTime=now 2>&1) || fail "run a: scontrol update StartTime=now: $out"
until_ "$WAIT" no_jobs
[ -f "$R/ledger.json" ] || fail "run a: no merged ledger; merge log: $(cat "$R/slurm/merge.log")"
grep -q "^shard 0 of 2 (job .*): 1 threads" "$R/slurm/shard-0.log" || fail "run a: threads not limited to the 1 allocated CPU"
[ "$(grep -c '^shard 1 of 2 ' "$R/slurm/shard-1.log")" = 2 ] || fail "run a: shard 1 did not run twice (requeue)"
same_ledger "$R/ledger.json" "$W/full/ledger.json" || fail "run a: the merged ledger differs from the unsharded one"
records=$(jq '.records | length' "$R/ledger.json")
[ "$records" = $LIMIT ] || fail "run a: $records records"
say "run a: merged ledger equals the unsharded one ($records records; shard 1 was requeued mid-run)"

# --- 2. A shard killed with SIGKILL: the merge fails naming it, its recovery command completes the run ----------
say "run b: kill -9 shard 1's process"
B=$(submit b)
R=$D/runs/b
until_ "$WAIT" running "${B}_1"
until_ "$WAIT" has_progress "$R/ledger-1-of-2.json"
pid=''
for p in $(scontrol listpids "$(jobid "${B}_1")" | awk 'NR > 1 && $1 ~ /^[0-9]+$/ { print $1 }'); do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = evaluate ] && pid=$p
done
[ -n "$pid" ] || fail "run b: no evaluate process in ${B}_1: $(scontrol listpids "$(jobid "${B}_1")" 2>&1)"
say "run b: shard 1 (pid $pid) at step $(steps_done "$R/ledger-1-of-2.json"): kill -9"
kill -9 "$pid"
until_ "$WAIT" merge_ended
merge_state=$(state "$(merge_job b)")
[ "$merge_state" = FAILED ] || fail "run b: the merge ended $merge_state, not FAILED"
if grep -q '^{"example":"evaluate"' "$R/slurm/merge.log"; then fail "run b: the merge succeeded with a killed shard"; fi
grep -q "shards unfinished: 1 " "$R/slurm/merge.log" || fail "run b: the merge did not name shard 1: $(cat "$R/slurm/merge.log")"
recover=$(sed -n 's/^  \(bash .* --resume .*\)$/\1/p' "$R/slurm/merge.log" | head -n 1)
[ -n "$recover" ] || fail "run b: no recovery command in the merge log: $(cat "$R/slurm/merge.log")"
say "run b: the merge failed naming shard 1; recovering with: $recover"
eval "$recover" >"$W/log/recover.log" 2>&1 || fail "run b: recovery: $(cat "$W/log/recover.log")"
until_ "$WAIT" no_jobs
[ -f "$R/ledger.json" ] || fail "run b: no merged ledger after recovery: $(tail -n 5 "$R/slurm/merge.log")"
same_ledger "$R/ledger.json" "$W/full/ledger.json" || fail "run b: the recovered ledger differs from the unsharded one"
say "run b: recovered; merged ledger equals the unsharded one"
say "PASS ($((SECONDS - START)) s)"
