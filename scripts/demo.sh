#!/usr/bin/env bash
# The main job on the embedded default: local Kafka (or Tansu) and Redis, a model made
# here, two workers, 20,000 requests; prints throughput and latency. Flags go to
# `streamfer demo` (for example --records 50000 --workers 2 --json).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
exec streamfer demo "$@"
