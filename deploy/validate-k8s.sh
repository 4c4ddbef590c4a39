#!/usr/bin/env bash
# CI: the Kubernetes manifests of deploy/ validated against the API schemas (kubernetes-validate from PyPI,
# --strict: unknown fields are errors), in a virtual environment made in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")"
venv=$(mktemp -d /tmp/armoury-k8s-validate.XXXXXX)
trap 'rm -rf "$venv"' EXIT
if ! python3 -m venv "$venv" 2>/dev/null; then
  # Debian's python3 makes virtual environments only with python3-venv.
  [ "$(id -u)" = 0 ] || { echo "validate-k8s.sh: python3 -m venv fails: install python3-venv" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  rm -rf "$venv" && mkdir -p "$venv" && python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
"$venv/bin/kubernetes-validate" --strict --no-warn k8s-*.yaml
