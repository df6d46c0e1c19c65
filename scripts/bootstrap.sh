#!/usr/bin/env bash
# Make a fresh machine ready: system packages (PostgreSQL server, Java) when
# missing, a virtualenv in .venv with the project and its test dependencies.
# Idempotent: a second run only checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"

need_apt=()
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v postgres >/dev/null 2>&1; then
    need_apt+=(postgresql)
fi
if ! command -v java >/dev/null 2>&1; then
    need_apt+=(default-jre-headless)
fi
# gSOAP's WS-RM plugin: the real peer of the interoperability tests.
if [ ! -f /usr/share/gsoap/plugin/wsrmapi.c ] || ! command -v soapcpp2 >/dev/null 2>&1; then
    need_apt+=(gsoap libgsoap-dev)
fi
# haproxy: the load balancer in front of the hosts of the multi-host tests (and the deploy guide's example).
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
    need_apt+=(haproxy)
fi
# Graphviz: the documentation draws the state machines from their code at build time.
if ! command -v dot >/dev/null 2>&1; then
    need_apt+=(graphviz)
fi
for tool in make gcc pkg-config; do
    command -v "$tool" >/dev/null 2>&1 || need_apt+=("$( [ "$tool" = gcc ] && echo build-essential || echo "$tool")")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "bootstrap: installing ${need_apt[*]} with apt-get" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
    # Debian starts a cluster on install; the project runs its own servers.
    $SUDO systemctl stop postgresql >/dev/null 2>&1 || $SUDO service postgresql stop >/dev/null 2>&1 || true
    # and haproxy its own, with the default configuration: the tests run theirs.
    $SUDO systemctl stop haproxy >/dev/null 2>&1 || $SUDO service haproxy stop >/dev/null 2>&1 || true
fi

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# the C one-phase path (setup.py, txmanager/_onephase.c) is built by the install: a change to it
# installs again, so that no extension older than its Python twin is left in the tree
stamp=".venv/.installed-$(cat pyproject.toml setup.py txmanager/_onephase.c | sha1sum | cut -c1-12)-${WSRM_EXTRAS:-test}"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[${WSRM_EXTRAS:-test}]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
