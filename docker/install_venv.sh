#!/usr/bin/env bash
# The image's venv, /opt/venv, installed in the stage that ships it (docker/Dockerfile's `runtime`), from the
# wheelhouse that scripts/docker_build.sh serves on the build host over HTTP (the build runs with
# `--network host`). The legacy builder cannot mount the wheels into a RUN, and copying them in would keep
# them in a layer; installing the venv in another stage and copying it over wrote the same gigabyte twice more
# (the builder's layer, then the copy: 40 s of a 222 s build on AMD EPYC Zen 5, docs/benchmarks.md).
#
#   install_venv.sh URL REQUIREMENTS HOROVOD
#     URL           the served wheelhouse (pip's --find-links)
#     REQUIREMENTS  the pinned requirements.txt (copied into the image: its bytes are the layer's cache key)
#     HOROVOD       a file naming Horovod's file in the wheelhouse, relative to URL: the wheel that
#                   scripts/build_horovod.sh cached (installed as it is) or the sdist (compiled here, with
#                   compilers that are removed again in the same step)
#
# Then docker/slim_venv.sh removes what the runtime never uses (it strips libraries with binutils, also
# installed for this step only).
set -euo pipefail
URL=${1:?usage: install_venv.sh URL REQUIREMENTS HOROVOD}
REQUIREMENTS=${2:?usage: install_venv.sh URL REQUIREMENTS HOROVOD}
HOROVOD=${3:?usage: install_venv.sh URL REQUIREMENTS HOROVOD}
HERE=$(dirname "$0")

hvd=$(cat "$HOROVOD")
case "$hvd" in
    *.whl) tools="binutils" ;;
    *.tar.gz) tools="binutils build-essential cmake python3-dev" ;;
    *) echo "[install_venv] $HOROVOD names neither a wheel nor an sdist: '$hvd'" >&2; exit 1 ;;
esac
before=$(dpkg-query -W -f '${Package}\n' | sort)
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $tools >/dev/null

python3 -m venv /opt/venv
/opt/venv/bin/pip install --quiet --no-index --find-links "$URL/" -r "$REQUIREMENTS"
# scripts/build_horovod.sh finds a wheel in its cache folder (<cache>/tf-<version>-py311-<patch level>/) or an
# sdist (<cache>/tf-<version>-py311/): the served path below horovod/ is that layout
cache=/tmp/horovod-cache
mkdir -p "$cache/$(dirname "${hvd#horovod/}")"
/opt/venv/bin/python -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$URL/$hvd" "$cache/${hvd#horovod/}"
TFNET_WHEEL_CACHE=$cache bash "$HERE/build_horovod.sh" /opt/venv/bin/python
rm -rf "$cache"
bash "$HERE/slim_venv.sh" /opt/venv

# every package this step installed, by name (`--auto-remove` leaves some: make, perl, xz-utils, bzip2)
added=$(comm -13 <(echo "$before") <(dpkg-query -W -f '${Package}\n' | sort))
# shellcheck disable=SC2086
apt-get purge -y -qq $added >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /root/.cache /tmp/*
