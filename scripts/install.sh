#!/usr/bin/env bash
# Create .venv and install everything tfnet needs: TensorFlow, PySpark, the test and OpenVINO extras,
# and Horovod built from source against that TensorFlow (scripts/build_horovod.sh).
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
echo "[tfnet] environment ready in $VENV"
