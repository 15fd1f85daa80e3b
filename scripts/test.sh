#!/usr/bin/env bash
# Lint, type-check, build the documentation and run every test against real Apache Kafka
# and redis-server, which the suite starts itself (or KAFKA_BOOTSTRAP_SERVERS /
# REDIS_URL); then the unit tests on the lowest dependency versions allowed
# (scripts/floors.sh). Flags go to pytest; the 40 slowest tests are listed at the end, to keep
# the suite inside its time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
ruff check worker streamfer_dev tests benchmarks
ruff format --check worker streamfer_dev tests benchmarks
mypy
# The documentation site, offline, into a git-ignored folder: a broken link, a missing
# page or any other warning fails the build (mkdocs.yml sets strict). Not --quiet: it
# drops the warnings before strict mode counts them.
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir build/site
# Triton's server venv (streamfer_dev.triton: nvidia-pytriton under Debian's python3), made
# once in the tool cache so that no test pays for it; where it cannot be, those tests skip.
python -c 'from streamfer_dev.triton import server_python; server_python()' ||
    echo "streamfer: no Triton server here; the Triton tests will skip" >&2
set +e
python -m pytest -q --durations=40 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "streamfer: pytest collected no tests; that is a failure" >&2
    exit 1
fi
if [ "$rc" != 0 ]; then
    exit "$rc"
fi
# The unit tests again on the lowest dependency versions pyproject.toml allows
# (STREAMFER_FLOORS=0 skips them).
if [ "${STREAMFER_FLOORS:-1}" != 0 ]; then
    bash scripts/floors.sh -p no:cacheprovider
fi
