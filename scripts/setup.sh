#!/usr/bin/env bash
# Set up millwheel on a fresh machine: Java 17's JDK (for Spark) if no Java, a virtualenv in .venv
# with the package and its pinned dependencies. With --test, also the test tools and
# Debian's Chromium (for the dashboard's browser test), etcd (the IdRegistry's replicated backend) and
# PostgreSQL (the database-sink test, tests/runtime/test_spark_sink.py).
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

apt_install() {
    if command -v apt-get >/dev/null 2>&1; then
        local sudo=""
        [[ $(id -u) -ne 0 ]] && sudo="sudo"
        $sudo apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    else
        echo "setup: please install $* (no apt-get here)" >&2
        return 1
    fi
}

if ! command -v java >/dev/null 2>&1; then
    # the JDK, not only the JRE: its javac builds the local sessions' file system, which sets
    # permissions without a chmod process per file (millwheel/runtime/_worker_home.py)
    echo "setup: installing Java 17 for Spark"
    apt_install openjdk-17-jdk-headless
fi
if [[ $want_test -eq 1 ]] && ! command -v chromium >/dev/null 2>&1; then
    echo "setup: installing Chromium for the dashboard test"
    apt_install chromium || echo "setup: chromium not installed; browser tests will be skipped" >&2
fi
if [[ $want_test -eq 1 ]] && ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "setup: installing PostgreSQL for the database-sink test"
    apt_install postgresql || echo "setup: postgresql not installed; the database-sink test will be skipped" >&2
fi
if [[ $want_test -eq 1 ]] && ! command -v etcd >/dev/null 2>&1; then
    echo "setup: installing etcd for the IdRegistry's replicated backend tests"
    apt_install etcd-server || echo "setup: etcd not installed; the registry's etcd tests will be skipped" >&2
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [[ $want_test -eq 1 ]]; then
    .venv/bin/python -m pip install -q -e ".[test]"
else
    .venv/bin/python -m pip install -q -e .
fi
# Spark's classes for the driver JVM, mapped instead of loaded at every start (~1.5 s each;
# millwheel/runtime/_cds.py): one short training run on Spark
.venv/bin/python -m millwheel.runtime._cds || echo "setup: no class-data archive for Spark's JVM (Spark starts without it)" >&2
echo "setup: ready ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
