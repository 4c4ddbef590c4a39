#!/usr/bin/env bash
# One evaluation on Kubernetes under its own run name: the Indexed Job (k8s-indexed-job.yaml), then, once it has
# ended — completed or failed, never waiting forever — the merge (k8s-merge-job.yaml), whose log names any shard
# that did not finish. Results: /data/runs/RUN on the volume (k8s-pvc.yaml, applied once beforehand).
#   bash deploy/k8s-run.sh [RUN]
# Without RUN a fresh name (eval-<UTC date and time>) is made and printed. With the RUN of an earlier run it
# continues that run: a failed Job is deleted and applied again, finished shards return at once (their ledgers
# are complete) and the others continue from their ledgers, then the merge runs again.
set -euo pipefail
cd "$(dirname "$0")"
RUN=${1:-eval-$(date -u +%Y%m%d-%H%M%S)}
[[ $RUN =~ ^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$ ]] || {
  echo "k8s-run.sh: RUN must be lower-case letters, digits and '-', at most 40 characters" >&2
  exit 2
}
job=armoury-evaluate-$RUN
merge=armoury-evaluate-merge-$RUN

# The true conditions of job $1 (Complete, Failed, …), empty while it runs or when it does not exist.
conditions() { kubectl get job "$1" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}' 2>/dev/null || true; }
# Waits until job $1 has completed or failed and prints which.
wait_ended() {
  local c
  while true; do
    c=$(conditions "$1")
    case " $c" in *" Complete "*) echo Complete; return ;; *" Failed "*) echo Failed; return ;; esac
    sleep 15
  done
}

echo "run: $RUN (results in /data/runs/$RUN)"
case " $(conditions "$job")" in
  *" Complete "*) echo "$job has completed already" ;;
  *" Failed "*)
    echo "$job failed before: applying it again (finished shards return at once, the others continue)"
    kubectl delete job "$job" --wait=true
    sed "s/run-example/$RUN/g" k8s-indexed-job.yaml | kubectl apply -f - ;;
  *) sed "s/run-example/$RUN/g" k8s-indexed-job.yaml | kubectl apply -f - ;;
esac
echo "shards: $(wait_ended "$job")"

kubectl delete job "$merge" --ignore-not-found --wait=true
sed "s/run-example/$RUN/g" k8s-merge-job.yaml | kubectl apply -f -
result=$(wait_ended "$merge")
kubectl logs "job/$merge" | tail -n 30
if [ "$result" != Complete ]; then
  echo "the merge failed (above: the shards that did not finish). Their pods' logs:" >&2
  echo "  kubectl logs -l job-name=$job --prefix --tail=20" >&2
  echo "Recover: fix the cause, then continue the run with: bash $0 $RUN" >&2
  exit 1
fi
echo "done: /data/runs/$RUN/report.md"
