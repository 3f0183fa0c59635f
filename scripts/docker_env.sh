#!/usr/bin/env bash
# Get a Docker engine working on a Debian machine without systemd and without registry access, and
# make sure the base image the tfnet Dockerfile builds on exists.
#
#   scripts/docker_env.sh            engine + Compose + base image; prints the base image's name last
#   scripts/docker_env.sh --engine   engine + Compose only
#
# 1. Installs Debian's `docker.io` and `docker-compose` (Compose v1) with apt when `dockerd` or
#    `docker-compose` is missing (about 16 s).
# 2. Starts `dockerd` in the background when no engine answers (there is no systemd here), after
#    removing a stale pid file; its log goes to $TFNET_DOCKERD_LOG (default /tmp/tfnet-dockerd.log).
# 3. Base image ($TFNET_BASE_IMAGE, default tfnet-base:bookworm): if it is not there and the public
#    `debian:bookworm-slim` cannot be pulled, makes it with `debootstrap --variant=minbase bookworm`
#    from this machine's own apt mirror, slims it and `docker import`s it (1 to 2 minutes, ~75 MB).
#
# Needs root (apt, dockerd). Safe to run again: every step is skipped when already done.
set -euo pipefail

BASE_IMAGE=${TFNET_BASE_IMAGE:-tfnet-base:bookworm}
PUBLIC_BASE=debian:bookworm-slim
DOCKERD_LOG=${TFNET_DOCKERD_LOG:-/tmp/tfnet-dockerd.log}
log() { echo "[docker_env] $*" >&2; }
die() { echo "[docker_env] error: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "'$*' needs root (run this script as root or install sudo)"; fi
}

# --- 1. engine and Compose -------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
# the engine's networking (ip, tc, iptables), as the namespaced hosts of tests/netns.py need them too
as_root bash "$(dirname "$0")/host_tools.sh"
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "no dockerd/docker-compose and no apt-get: install Docker Engine and Compose yourself"
    log "installing ${missing[*]} with apt"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. the daemon ---------------------------------------------------------------------------
if ! timeout 10 docker info >/dev/null 2>&1; then
    pidfile=/var/run/docker.pid
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        log "removing stale $pidfile"
        as_root rm -f "$pidfile"
    fi
    if ! pgrep -x dockerd >/dev/null; then
        log "starting dockerd (log: $DOCKERD_LOG)"
        as_root setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 < /dev/null &
    fi
    for _ in $(seq 60); do
        timeout 5 docker info >/dev/null 2>&1 && break
        sleep 1
    done
    timeout 10 docker info >/dev/null 2>&1 || die "dockerd did not answer within 60 s; its log ($DOCKERD_LOG) ends with:
$(tail -n 20 "$DOCKERD_LOG" 2>/dev/null)"
fi
log "engine $(docker version --format '{{.Server.Version}}') answers; $(docker-compose version --short 2>/dev/null | sed 's/^/compose /')"
[ "${1:-}" = "--engine" ] && exit 0

# --- 3. the base image -----------------------------------------------------------------------
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "base image $BASE_IMAGE is there"
elif timeout 60 docker pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
    docker tag "$PUBLIC_BASE" "$BASE_IMAGE"
    log "pulled $PUBLIC_BASE as $BASE_IMAGE"
else
    log "cannot pull $PUBLIC_BASE: making $BASE_IMAGE with debootstrap from this machine's apt mirror"
    command -v debootstrap >/dev/null 2>&1 || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    mirror=$(grep -rhoE '^(URIs:|deb) +[^ ]*http[^ ]*debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | grep -v security | head -n 1 | awk '{print $2}' || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    root=$(mktemp -d /tmp/tfnet-base.XXXXXX)
    trap 'as_root rm -rf "$root"' EXIT
    log "debootstrap --variant=minbase bookworm from $mirror"
    as_root debootstrap --variant=minbase bookworm "$root" "$mirror" >/tmp/tfnet-debootstrap.log 2>&1 \
        || die "debootstrap failed; see /tmp/tfnet-debootstrap.log"
    # slim: no apt lists or caches, docs, locales; keep usr/share/man/man1 (the JDK's install writes there)
    as_root rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
        "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/var/log/*
    as_root find "$root/usr/share/man" -mindepth 1 -maxdepth 1 ! -name man1 -exec rm -rf {} +
    as_root mkdir -p "$root/usr/share/man/man1"
    echo "deb $mirror bookworm main" | as_root tee "$root/etc/apt/sources.list" >/dev/null
    echo "deb $mirror bookworm-updates main" | as_root tee -a "$root/etc/apt/sources.list" >/dev/null
    as_root tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
    log "made $BASE_IMAGE ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
fi
echo "$BASE_IMAGE"
