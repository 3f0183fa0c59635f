#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist against the TensorFlow installed in a venv, and install it.
#
# Horovod 0.28.1 (the last release) does not compile against TF 2.21 because
# horovod/tensorflow/xla_mpi_ops.cc includes XLA headers TF no longer ships. We drop that one
# source from horovod/tensorflow/CMakeLists.txt and build with TensorFlow + Gloo only.
#
# Horovod 0.28.1's process sets (the global one included, which carries every collective) make their
# Gloo device without HOROVOD_GLOO_IFACE (GlooContext::InitializeForProcessSet reads the new context's
# own, empty, interface), so Gloo binds to the address of the host's name: on a host whose name
# resolves to a loopback address (Debian's 127.0.1.1, this project's test hosts) the ranks of other
# hosts cannot reach it. The build takes the global context's interface there instead, and records
# the patches it made in horovod/tfnet_patches.py (optim/training/horovod.py checks it).
#
# pip does not cache wheels built from a patched local directory, so the wheel is kept in
# $TFNET_WHEEL_CACHE (default ~/.cache/tfnet/wheels/tf-<version>-py<version>-<patch level>) and reused on
# rebuilds. An sdist horovod-<version>.tar.gz in that folder (or in the one without the patch level) is
# used instead of downloading one (the image build has no index).
#
# Usage: scripts/build_horovod.sh [path/to/venv/python]
set -euo pipefail

PY=${1:-.venv/bin/python}
HVD_VERSION=0.28.1
PATCHES="gloo-iface-for-process-sets"  # the patch level: a new patch gets a new name here
CHECK="import horovod.tensorflow as h; assert h.gloo_built(); from horovod.tfnet_patches import PATCHES; \
assert set('$PATCHES'.split()) <= set(PATCHES)"

if "$PY" -c "$CHECK" >/dev/null 2>&1; then
    echo "[tfnet] horovod ${HVD_VERSION} with Gloo and tfnet's patches already installed"
    exit 0
fi

TF_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('tensorflow-cpu'))" 2>/dev/null \
    || "$PY" -c "import importlib.metadata as m; print(m.version('tensorflow'))")
BASE=${TFNET_WHEEL_CACHE:-$HOME/.cache/tfnet/wheels}/tf-${TF_VERSION}-py$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
CACHE=$BASE-$(echo "$PATCHES" | tr ' ' '+')
mkdir -p "$CACHE"

wheel=$(ls "$CACHE"/horovod-${HVD_VERSION}-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "[tfnet] building horovod ${HVD_VERSION} against tensorflow ${TF_VERSION} (about 7 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [ -f "$CACHE/horovod-${HVD_VERSION}.tar.gz" ]; then  # an sdist put there beforehand (the Docker build)
        cp "$CACHE/horovod-${HVD_VERSION}.tar.gz" "$work/"
    elif [ -f "$BASE/horovod-${HVD_VERSION}.tar.gz" ]; then
        cp "$BASE/horovod-${HVD_VERSION}.tar.gz" "$work/"
    else
        "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==${HVD_VERSION}" -d "$work"
    fi
    tar -xzf "$work/horovod-${HVD_VERSION}.tar.gz" -C "$work"
    src="$work/horovod-${HVD_VERSION}"
    # Leave out the XLA custom-call ops: their headers are gone from TF >= 2.16.
    sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    if grep -q xla_mpi_ops "$src/horovod/tensorflow/CMakeLists.txt"; then
        echo "[tfnet] could not remove xla_mpi_ops.cc from Horovod's CMakeLists.txt" >&2
        exit 1
    fi
    # Process sets make their Gloo device on the global context's interface (HOROVOD_GLOO_IFACE).
    "$PY" - "$src/horovod/common/gloo/gloo_context.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
head, sep, tail = text.partition("void GlooContext::InitializeForProcessSet(")
old = "device_attr.iface = gloo_iface_;"
if not sep or old not in tail.split("CreateDevice(")[0]:
    sys.exit("[tfnet] GlooContext::InitializeForProcessSet is not as expected: cannot patch its Gloo interface")
tail = tail.replace(old, "gloo_iface_ = global_context.gloo_iface_;\n  " + old, 1)
open(path, "w").write(head + sep + tail)
PATCH
    echo "PATCHES = tuple('$PATCHES'.split())  # made by tfnet's scripts/build_horovod.sh" > "$src/horovod/tfnet_patches.py"
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps "$src" -w "$work/dist"
    cp "$work"/dist/horovod-*.whl "$CACHE/"
    wheel=$(ls "$CACHE"/horovod-${HVD_VERSION}-*.whl | head -n 1)
fi

# --force-reinstall: the same version without the patches may be installed (an older .venv)
"$PY" -m pip install --quiet --no-deps --force-reinstall "$wheel"
"$PY" -c "$CHECK" || { echo "[tfnet] $wheel is not a Horovod with Gloo and tfnet's patches ($PATCHES)" >&2; exit 1; }
echo "[tfnet] horovod ${HVD_VERSION} installed from $wheel"
