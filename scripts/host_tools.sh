#!/usr/bin/env bash
# The tools of the namespaced test hosts (tests/netns.py) and of the Docker engine's networking: `ip` and `tc`
# (iproute2) and `iptables`. A fresh machine has no iptables: Debian's packages are installed with apt when a tool
# is missing (needs root). Safe to run again: nothing is installed when all three are there.
set -euo pipefail
missing=()
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
[ ${#missing[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null 2>&1 || { echo "[host_tools] ${missing[*]} missing and no apt-get: install them yourself" >&2; exit 1; }
echo "[host_tools] installing ${missing[*]} with apt" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
