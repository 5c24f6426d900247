#!/usr/bin/env bash
# Installs what the failover drill (tests/ha) needs, idempotently; run as root (CI and the dev VMs are).
#   - iptables from Debian (partition_leader cuts a node off by its cgroup and ports);
#   - etcd 3.4 from Debian (`etcd-server`, `etcd-client`); the drill starts its own members, so a service
#     the package starts is stopped and disabled (it would hold the default ports 2379/2380);
#   - Patroni 4.1.5 (with its etcd3 and psycopg3 extras) in a virtualenv the `postgres` OS user can run:
#     Patroni must run as that user, and an interpreter under /root (pyenv) is not executable for it, so
#     the venv is built from Debian's /usr/bin/python3 under /opt/taskq-ha (TASKQ_HA_PREFIX).
# PostgreSQL 15 itself (/usr/lib/postgresql/15/bin) comes with the machine image; it is checked, not installed.
set -euo pipefail

prefix="${TASKQ_HA_PREFIX:-/opt/taskq-ha}"
patroni_version="4.1.5"
pg_bin="${TASKQ_HA_PG_BIN:-/usr/lib/postgresql/15/bin}"

say() { echo "ha-setup: $*"; }

if [[ $(id -u) -ne 0 ]]; then
    say "must run as root (apt-get, and a venv owned by root that the postgres user can execute)" >&2
    exit 2
fi

for tool in postgres initdb pg_ctl pg_basebackup pg_rewind; do
    if [[ ! -x "$pg_bin/$tool" ]]; then
        say "PostgreSQL binaries missing: $pg_bin/$tool (set TASKQ_HA_PG_BIN)" >&2
        exit 2
    fi
done
id postgres >/dev/null 2>&1 || { say "no 'postgres' OS user (it comes with PostgreSQL's Debian packages)" >&2; exit 2; }

# -- iptables -------------------------------------------------------------------------------------------
if ! command -v iptables >/dev/null; then
    say "installing iptables (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables
fi

# -- etcd ---------------------------------------------------------------------------------------------
if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    say "installing etcd-server and etcd-client (apt-get)"
    apt-get update -qq
    # policy-rc.d 101: the package's postinst may not start its service (the drill runs its own members)
    policy=/usr/sbin/policy-rc.d
    had_policy=0
    [[ -e $policy ]] && had_policy=1
    if ((had_policy == 0)); then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server etcd-client
    ((had_policy == 0)) && rm -f "$policy"
fi
# whatever started anyway (a systemd machine, an earlier install): stop it and keep it from starting again
if command -v systemctl >/dev/null && systemctl list-unit-files etcd.service >/dev/null 2>&1; then
    systemctl stop etcd.service >/dev/null 2>&1 || true
    systemctl disable etcd.service >/dev/null 2>&1 || true
fi
if [[ -x /etc/init.d/etcd ]]; then
    /etc/init.d/etcd stop >/dev/null 2>&1 || true
fi
say "$(etcd --version 2>/dev/null | head -1)"

# -- Patroni --------------------------------------------------------------------------------------------
patroni="$prefix/bin/patroni"
if [[ ! -x $patroni ]] || [[ "$("$prefix/bin/python" -c 'import patroni.version as v; print(v.__version__)' 2>/dev/null)" != "$patroni_version" ]]; then
    say "installing Patroni $patroni_version into $prefix"
    /usr/bin/python3 -m venv "$prefix"
    "$prefix/bin/pip" install -q --disable-pip-version-check "patroni[etcd3,psycopg3]==$patroni_version" psycopg-binary
fi
chmod -R a+rX "$prefix"
# the drill runs Patroni as postgres: prove that user can start the interpreter and import Patroni
if ! runuser -u postgres -- "$prefix/bin/python" -c 'import patroni, psycopg' >/dev/null 2>&1; then
    say "the postgres user cannot run $prefix/bin/python with patroni and psycopg" >&2
    exit 1
fi
say "patroni $("$prefix/bin/python" -c 'import patroni.version as v; print(v.__version__)') in $prefix, runnable by postgres"
