# Sourced by scripts/demo.sh and scripts/test.sh: make a fresh machine ready.
# Installs what the stack needs (redis-server; Java 17 and Maven for Apache Kafka) when
# missing and we may, then a virtual environment with streamfer and its dev tools.
set -euo pipefail

need_apt=()
# redis-server also runs the Sentinels of the failover tests (redis-server --sentinel)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # the TLS tests make certificates
# The Triton tests' server (streamfer_dev.triton) runs under Debian's python3 in a venv of
# its own: its Python backend embeds that interpreter's shared libpython.
[ -x /usr/bin/python3 ] || need_apt+=(python3)
/usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
/usr/bin/python3 -c 'import sysconfig, sys; sys.exit(not sysconfig.get_config_var("Py_ENABLE_SHARED"))' \
    >/dev/null 2>&1 && ls /usr/lib/*/libpython3*.so.1* >/dev/null 2>&1 || need_apt+=(libpython3-dev)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "streamfer: installing ${need_apt[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "streamfer: please install ${need_apt[*]} (Debian package names)" >&2
    fi
fi

# Go builds toxiproxy (the network-fault tests' fault proxy) into the tool cache on first
# use; without it those tests skip.
command -v go >/dev/null 2>&1 || echo "streamfer: Go not found; the network-fault tests will skip (Debian: golang)" >&2

PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "streamfer needs Python 3.11 or newer ($PY is $("$PY" --version 2>&1))" >&2; exit 2; }
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.streamfer-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[dev]"
    cp pyproject.toml "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
