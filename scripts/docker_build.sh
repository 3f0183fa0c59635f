#!/usr/bin/env bash
# Build the tfnet cluster image (docker/Dockerfile) on a machine like the ones this project is built on:
# no registry access, and no pip index reachable from inside containers.
#
#   scripts/docker_build.sh [IMAGE_TAG]          default tag: tfnet:latest
#   scripts/docker_build.sh --wheelhouse-only    only step 2 (needs no Docker)
#
# 1. scripts/docker_env.sh: a running engine, Compose, and the base image (pulled or made locally).
# 2. The wheelhouse, on the host, outside git: $TFNET_WHEELHOUSE (default ~/.cache/tfnet/wheelhouse/py311):
#    every wheel that `tfnet[openvino,s3]` (not the `examples` extra: matplotlib only draws the ResNet-50
#    report's plot), ONNX (TFNet.from_onnx; not onnxruntime), TensorBoard (TFOptimizer writes its events
#    when given a model_dir), scikit-learn (the digits main job reads its digits), the Spark Connect
#    client and the build tools need, pinned in requirements.txt; plus Horovod: the wheel scripts/build_horovod.sh cached when `make` built .venv,
#    and Horovod's sdist, so that the image can compile it when no wheel is cached.
#    Made with the host's pip, which trusts the host's certificates; nothing is copied into the image
#    but wheels. A second run reuses it and needs no network.
# 3. tfnet's own wheel, built on the host from the files git tracks or would track (`git ls-files -co
#    --exclude-standard`: never .venv or a stale build/).
# 4. `docker build` (the legacy builder, `--network host`) on a context streamed from here: src/ (those
#    files) and build/ (the pins, horovod.txt naming Horovod's file, tfnet's wheel), while the wheelhouse is
#    served over HTTP on 127.0.0.1 for the image's pip (docker/install_venv.sh). The server listens on
#    $TFNET_WHEELHOUSE_PORT (default 47611) while that port is free, since its URL is part of the venv
#    layer's cache key; on another free port otherwise (the venv layer is then installed again).
# Settings: TFNET_PYTHON (the Python 3.11 whose pip makes the wheelhouse; default .venv/bin/python, else
# python3), TFNET_BASE_IMAGE (see docker_env.sh), TFNET_WHEEL_CACHE (build_horovod.sh's wheel cache),
# TFNET_DOCKER_BUILD_ARGS (more `docker build` options, e.g. --no-cache), TFNET_WHEELHOUSE_PORT (above).
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${1:-tfnet:latest}
ONLY_WHEELS=0
[ "$TAG" = --wheelhouse-only ] && ONLY_WHEELS=1
HVD_VERSION=0.28.1
# s3: model_dir on an S3 store (s3fs, aiobotocore, botocore, aiohttp; slim_venv.sh trims botocore's data)
EXTRAS="openvino,s3"
# onnx: TFNet.from_onnx / save_onnx (the `onnx` extra without onnxruntime, the tests' oracle: 78 MB);
# grpcio-status, googleapis-common-protos, zstandard: the Spark Connect client (pyspark[connect] less
# grpcio, which TensorFlow already brings), so that a driver can reach a Connect server
EXTRA_REQS=("scikit-learn>=1.4" "tensorboard" "onnx>=1.16" "grpcio-status>=1.76" "googleapis-common-protos>=1.71"
            "zstandard>=0.25" "setuptools<81" "wheel")
log() { echo "[docker_build] $*" >&2; }
die() { echo "[docker_build] error: $*" >&2; exit 1; }

[ $ONLY_WHEELS = 1 ] || BASE=$(bash scripts/docker_env.sh | tail -n 1)

PY=${TFNET_PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
[ "$pyver" = 311 ] || die "$PY is Python $pyver; the image runs Debian bookworm's Python 3.11, so the wheelhouse needs a Python 3.11 (set TFNET_PYTHON)"
WH=${TFNET_WHEELHOUSE:-$HOME/.cache/tfnet/wheelhouse}/py311
mkdir -p "$WH/horovod"

# --- requirements, resolved once per setup.py -------------------------------------------------
key=$(cat setup.py <(echo "$EXTRAS ${EXTRA_REQS[*]}") | sha256sum | cut -c1-16)
pinned="$WH/requirements-$key.txt"
if [ ! -s "$pinned" ]; then
    log "resolving .[$EXTRAS] ${EXTRA_REQS[*]} with $PY's pip"
    report=$(mktemp)
    "$PY" -m pip install --quiet --dry-run --ignore-installed --report "$report" ".[$EXTRAS]" "${EXTRA_REQS[@]}"
    "$PY" - "$report" >"$pinned.tmp" <<'EOF'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if meta["name"].lower() != "tfnet":
        print(f"{meta['name']}=={meta['version']}")
EOF
    mv "$pinned.tmp" "$pinned"
    rm -f "$report"
fi
cp "$pinned" "$WH/requirements.txt"

# --- wheels: offline from the wheelhouse when they are all there, else from the index ---------
if ! "$PY" -m pip wheel --quiet --no-index --find-links "$WH" --no-deps -r "$WH/requirements.txt" -w "$WH" >/dev/null 2>&1; then
    log "downloading/building $(wc -l <"$WH/requirements.txt") wheels into $WH"
    "$PY" -m pip wheel --quiet --no-deps -r "$WH/requirements.txt" -w "$WH"
fi

# --- Horovod: the cached wheel if there is one, and the sdist for the in-image build otherwise --
tf_version=$(sed -n -E 's/^tensorflow[-_]cpu==//p' "$WH/requirements.txt")
[ -n "$tf_version" ] || die "no tensorflow-cpu pin in $WH/requirements.txt"
# the sdist in tf-<version>-py311/, a wheel with tfnet's patches in tf-<version>-py311-<patch level>/ (as build_horovod.sh keeps them)
patches=$(sed -n -E 's/^PATCHES="([^"]*)".*/\1/p' scripts/build_horovod.sh | tr ' ' '+')
[ -n "$patches" ] || die "no PATCHES line in scripts/build_horovod.sh"
hvd_dir="$WH/horovod/tf-${tf_version}-py311"
mkdir -p "$hvd_dir" "$hvd_dir-$patches"
cached=$(ls "${TFNET_WHEEL_CACHE:-$HOME/.cache/tfnet/wheels}/tf-${tf_version}-py311-$patches/horovod-${HVD_VERSION}-"*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$cached" ] && ! cmp -s "$cached" "$hvd_dir-$patches/$(basename "$cached")"; then
    cp "$cached" "$hvd_dir-$patches/"
fi
if [ ! -f "$hvd_dir/horovod-${HVD_VERSION}.tar.gz" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==${HVD_VERSION}" -d "$hvd_dir"
fi
if ls "$hvd_dir-$patches"/horovod-*.whl >/dev/null 2>&1; then
    hvd_file=$(ls "$hvd_dir-$patches"/horovod-*.whl | head -n 1)
    log "Horovod: the cached wheel $(basename "$hvd_file") ($patches)"
else
    hvd_file="$hvd_dir/horovod-${HVD_VERSION}.tar.gz"
    log "Horovod: no cached wheel; the image compiles it from the sdist (about 7 minutes on 2 free cores)"
fi

[ $ONLY_WHEELS = 1 ] && exit 0

# --- the context: the repository's files and tfnet's wheel ----------------------------------------
ctx=$(mktemp -d)
server=""
cleanup() {
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$ctx"
}
trap cleanup EXIT
mkdir -p "$ctx/src" "$ctx/build/dist" "$ctx/wheel-src"
git ls-files -co --exclude-standard -z | tar --null -c -f - -T - | tar -x -f - -C "$ctx/src"
cp -a "$ctx/src/." "$ctx/wheel-src/"  # setuptools writes build/ and *.egg-info into the tree it builds
"$PY" -m pip wheel --quiet --no-index --no-deps --no-build-isolation -w "$ctx/build/dist" "$ctx/wheel-src" >/dev/null
rm -rf "$ctx/wheel-src"
cp "$WH/requirements.txt" "$ctx/build/requirements.txt"
realpath --relative-to="$WH" "$hvd_file" >"$ctx/build/horovod.txt"

# --- the wheelhouse over HTTP, for the image's pip -----------------------------------------------
portfile="$ctx/port"
"$PY" - "$WH" "${TFNET_WHEELHOUSE_PORT:-47611}" "$portfile" <<'EOF' &
import functools, http.server, os, sys
folder, port, portfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = functools.partial(Handler, directory=folder)
try:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
except OSError:  # taken: any free port (the venv layer's cache key changes with it)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
with open(portfile + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(portfile + ".tmp", portfile)
server.serve_forever()
EOF
server=$!
for _ in $(seq 300); do
    [ -s "$portfile" ] && break
    kill -0 "$server" 2>/dev/null || die "the wheelhouse's HTTP server did not start"
    sleep 0.1
done
[ -s "$portfile" ] || die "the wheelhouse's HTTP server gave no port within 30 s"
url="http://127.0.0.1:$(cat "$portfile")"

# --- build ---------------------------------------------------------------------------------------
log "building $TAG on $BASE ($(du -sh "$WH" | cut -f1) wheelhouse at $url)"
start=$(date +%s)
tar -c -f - -C "$ctx" src build \
    | DOCKER_BUILDKIT=0 docker build --network host -f src/docker/Dockerfile --build-arg "BASE=$BASE" \
        --build-arg "WHEELHOUSE=$url" ${TFNET_DOCKER_BUILD_ARGS:-} -t "$TAG" -
log "built $TAG in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.2f GB", $1/1e9}')"
