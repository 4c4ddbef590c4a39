#!/bin/bash
# Shards of one evaluation as a Slurm job array, then the merge once every shard succeeded.
#   bash deploy/slurm-array.sh /shared/data 8 10000
set -euo pipefail
DATA=${1:-/shared/data}
SHARDS=${2:-8}
LIMIT=${3:-10000}
BIN=${BIN:-target/release/examples/evaluate}
COMMON="--model $DATA/model.safetensors --threat-model $DATA/threat-model.json --limit $LIMIT --out $DATA/out"

array=$(sbatch --parsable --array=0-$((SHARDS - 1)) --cpus-per-task=2 --mem=2G --requeue \
  --job-name=armoury-evaluate \
  --wrap="$BIN $COMMON --shard \${SLURM_ARRAY_TASK_ID}/$SHARDS")
sbatch --dependency=afterok:"$array" --cpus-per-task=2 --mem=2G --job-name=armoury-evaluate-merge \
  --wrap="$BIN $COMMON --merge $SHARDS"
echo "submitted array $array and its merge"
