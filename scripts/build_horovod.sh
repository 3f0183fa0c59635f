#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist against the TensorFlow installed in a venv, and install it.
#
# Horovod 0.28.1 (the last release) does not compile against TF 2.21 because
# horovod/tensorflow/xla_mpi_ops.cc includes XLA headers TF no longer ships. We drop that one
# source from horovod/tensorflow/CMakeLists.txt and build with TensorFlow + Gloo only.
#
# pip does not cache wheels built from a patched local directory, so the wheel is kept in
# $TFNET_WHEEL_CACHE (default ~/.cache/tfnet/wheels/tf-<version>) and reused on rebuilds. An sdist
# horovod-<version>.tar.gz in that folder is used instead of downloading one (the image build has no index).
#
# Usage: scripts/build_horovod.sh [path/to/venv/python]
set -euo pipefail

PY=${1:-.venv/bin/python}
HVD_VERSION=0.28.1

if "$PY" -c "import horovod.tensorflow as h; assert h.gloo_built()" >/dev/null 2>&1; then
    echo "[tfnet] horovod ${HVD_VERSION} with Gloo already installed"
    exit 0
fi

TF_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('tensorflow-cpu'))" 2>/dev/null \
    || "$PY" -c "import importlib.metadata as m; print(m.version('tensorflow'))")
CACHE=${TFNET_WHEEL_CACHE:-$HOME/.cache/tfnet/wheels}/tf-${TF_VERSION}-py$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
mkdir -p "$CACHE"

wheel=$(ls "$CACHE"/horovod-${HVD_VERSION}-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "[tfnet] building horovod ${HVD_VERSION} against tensorflow ${TF_VERSION} (about 7 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [ -f "$CACHE/horovod-${HVD_VERSION}.tar.gz" ]; then  # an sdist put there beforehand (the Docker build)
        cp "$CACHE/horovod-${HVD_VERSION}.tar.gz" "$work/"
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
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps "$src" -w "$work/dist"
    cp "$work"/dist/horovod-*.whl "$CACHE/"
    wheel=$(ls "$CACHE"/horovod-${HVD_VERSION}-*.whl | head -n 1)
fi

"$PY" -m pip install --quiet --no-deps "$wheel"
"$PY" -c "import horovod.tensorflow as h; assert h.gloo_built(), 'horovod built without Gloo'"
echo "[tfnet] horovod ${HVD_VERSION} installed from $wheel"
