#!/usr/bin/env bash
# One evaluation as a Slurm job array (one task per shard) and a merge job that runs once every task has ended,
# however it ended (`--dependency=afterany`): the merge checks that every shard finished and, when some did not,
# fails naming them and printing the command that reruns exactly those (each continues from its ledger).
#
#   bash deploy/slurm-array.sh [options] DATA [SHARDS [LIMIT]]        (defaults: 8 shards, 10000 samples)
#   bash deploy/slurm-array.sh --resume RUN_DIR [--indices 1,3]      (rerun shards of a run, then merge again)
#
# DATA is the shared directory every node mounts (deploy/README.md): DATA/model.safetensors, optionally
# DATA/threat-model.json, and the data set DATA/fashion-mnist/. Options:
#   --run NAME            the run's directory is DATA/runs/NAME (default: the UTC date and time, printed)
#   --out DIR             the run's directory itself (instead of --run)
#   --model FILE          default DATA/model.safetensors (.safetensors: the cnn's weights; .onnx: any model)
#   --dataset DIR|sample  the data set (`--data` of every job); default DATA/fashion-mnist, which must exist
#   --threat-model FILE   default DATA/threat-model.json if it exists, else evaluate's built-in AutoAttack L∞
#   --cpus N              CPUs per task (default 2); RAYON_NUM_THREADS follows the allocation
#   --mem SIZE            memory per task (default 2G)
#   --indices LIST        array indices to run (default all: 0-(SHARDS-1))
#   --sbatch "OPTS"       more sbatch options for every job (partition, account, time limit, …)
#   -- ARGS…              more evaluate flags for every job (e.g. --no-audit, --eps 0.03, --defense jpeg)
# BIN (environment) is the evaluate binary, default ${CARGO_TARGET_DIR:-target}/release/examples/evaluate, on a path
# every node sees. The run's directory gets the two job scripts (slurm/shard.sh, slurm/merge.sh) and their logs.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
die() { echo "slurm-array.sh: $*" >&2; exit 2; }
abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }

run='' out='' model='' dataset='' threat='' cpus=2 mem=2G indices='' resume='' extra_sbatch='' extra=()
positional=()
while [ $# -gt 0 ]; do
  case $1 in
    --run) run=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --dataset) dataset=$2; shift 2 ;;
    --threat-model) threat=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --indices) indices=$2; shift 2 ;;
    --resume) resume=$2; shift 2 ;;
    --sbatch) extra_sbatch=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) positional+=("$1"); shift ;;
  esac
done

# Submits the array (the given indices, or all) and its merge, from the job scripts in $1/slurm.
submit() {
  local dir=$1 list=$2 array merge
  local -a opts
  read -r -a opts <<<"$(cat "$dir/slurm/sbatch-options")"
  array=$(sbatch --parsable "${opts[@]}" --array="$list" --requeue --open-mode=append \
    --job-name=armoury-evaluate --output="$dir/slurm/shard-%a.log" "$dir/slurm/shard.sh")
  array=${array%%;*}
  merge=$(sbatch --parsable "${opts[@]}" --dependency="afterany:$array" --kill-on-invalid-dep=yes \
    --open-mode=append --job-name=armoury-evaluate-merge --output="$dir/slurm/merge.log" "$dir/slurm/merge.sh")
  merge=${merge%%;*}
  echo "run directory: $dir"
  echo "submitted array $array (shards $list) and merge $merge (after every shard has ended)"
  echo "logs: $dir/slurm/shard-<i>.log, $dir/slurm/merge.log; the result: $dir/report.md"
}

if [ -n "$resume" ]; then
  [ ${#positional[@]} -eq 0 ] || die "--resume takes the run directory alone"
  resume=$(abspath "$resume")
  [ -f "$resume/slurm/shard.sh" ] || die "$resume is not a run directory of this script (no slurm/shard.sh)"
  shards=$(cat "$resume/slurm/shards")
  submit "$resume" "${indices:-0-$((shards - 1))}"
  exit 0
fi

[ ${#positional[@]} -ge 1 ] || usage
DATA=$(abspath "${positional[0]}")
SHARDS=${positional[1]:-8}
LIMIT=${positional[2]:-10000}
BIN=$(abspath "${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/evaluate}")
[ -x "$BIN" ] || die "no evaluate binary at $BIN (cargo build --release --example evaluate, or set BIN)"
model=$(abspath "${model:-$DATA/model.safetensors}")
[ -f "$model" ] || die "no model at $model (give --model FILE)"
if [ -z "$dataset" ]; then
  dataset=$DATA/fashion-mnist
  [ -d "$dataset" ] || die "no data set at $dataset: give --dataset DIR (IDX files) or --dataset sample (the 1,000 \
embedded test images)"
elif [ "$dataset" != sample ]; then
  dataset=$(abspath "$dataset")
  [ -d "$dataset" ] || die "no data set at $dataset"
fi
if [ -z "$threat" ] && [ -f "$DATA/threat-model.json" ]; then
  threat=$DATA/threat-model.json
elif [ -n "$threat" ]; then
  threat=$(abspath "$threat")
  [ -f "$threat" ] || die "no threat model at $threat"
fi
if [ -z "$out" ]; then
  if [ -z "$run" ]; then
    run=$(date -u +%Y%m%d-%H%M%S)
    while [ -e "$DATA/runs/$run" ]; do run=$run-x; done
  fi
  out=$DATA/runs/$run
fi
out=$(abspath "$out")
if compgen -G "$out/ledger-*-of-*.json" >/dev/null; then
  echo "note: $out already holds shard ledgers; the shards continue them (and refuse another evaluation's)" >&2
fi
mkdir -p "$out/slurm"

# The evaluate command every job runs, quoted once here.
cmd=$(printf '%q ' "$BIN" --model "$model" --data "$dataset" --limit "$LIMIT" --out "$out" \
  ${threat:+--threat-model "$threat"} "${extra[@]}")
self=$(abspath "$0")
echo "$SHARDS" >"$out/slurm/shards"
echo "--cpus-per-task=$cpus --mem=$mem${extra_sbatch:+ $extra_sbatch}" >"$out/slurm/sbatch-options"

cat >"$out/slurm/shard.sh" <<EOF
#!/usr/bin/env bash
# Shard \$SLURM_ARRAY_TASK_ID of $SHARDS (written by deploy/slurm-array.sh). Rerunning it continues from its ledger.
set -euo pipefail
export RAYON_NUM_THREADS=\${SLURM_CPUS_PER_TASK:-1}
echo "shard \$SLURM_ARRAY_TASK_ID of $SHARDS (job \$SLURM_JOB_ID on \$(hostname)): \$RAYON_NUM_THREADS threads"
exec $cmd--shard "\$SLURM_ARRAY_TASK_ID/$SHARDS"
EOF

cat >"$out/slurm/merge.sh" <<EOF
#!/usr/bin/env bash
# The merge of the $SHARDS shards (written by deploy/slurm-array.sh): runs after every shard has ended, however.
set -uo pipefail
export RAYON_NUM_THREADS=\${SLURM_CPUS_PER_TASK:-1}
$cmd--merge $SHARDS 2>$(printf '%q' "$out/slurm/merge.err")
status=\$?
cat $(printf '%q' "$out/slurm/merge.err") >&2
[ \$status -eq 0 ] && exit 0
unfinished=\$(sed -n 's/.* shards unfinished: \([0-9,]*\) .*/\1/p' $(printf '%q' "$out/slurm/merge.err") | head -n 1)
if [ -n "\$unfinished" ]; then
  {
    echo "merge: shards \$unfinished of $SHARDS did not finish (their logs: $out/slurm/shard-<i>.log)."
    echo "Recover: rerun exactly those shards and merge again (each continues from its ledger):"
    echo "  bash $(printf '%q' "$self") --resume $(printf '%q' "$out") --indices \$unfinished"
    echo "or by hand, the same two submissions:"
    echo "  sbatch --parsable --array=\$unfinished $(cat "$out/slurm/sbatch-options") --requeue --open-mode=append \\\\"
    echo "    --output=$out/slurm/shard-%a.log $out/slurm/shard.sh  # prints the array's job id"
    echo "  sbatch $(cat "$out/slurm/sbatch-options") --dependency=afterany:<that id> --open-mode=append \\\\"
    echo "    --output=$out/slurm/merge.log $out/slurm/merge.sh"
  } >&2
fi
exit \$status
EOF
chmod +x "$out/slurm/shard.sh" "$out/slurm/merge.sh"

echo "evaluate: $cmd"
echo "threat model: ${threat:-the built-in one, AutoAttack standard L∞ list at ε = 0.1}"
submit "$out" "${indices:-0-$((SHARDS - 1))}"
