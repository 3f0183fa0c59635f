#!/usr/bin/env bash
# Measures docker/slim_venv.sh without Docker: makes the image's venv on this host from the
# same wheelhouse (scripts/docker_build.sh's) and Debian's Python 3.11, slims it, prints its size before
# and after (du -sb: what the image's venv layer holds), then runs scripts/slim_venv_smoke.py with it.
#
#   scripts/slim_venv_replica.sh /tmp/replica-venv
# Settings: TFNET_WHEELHOUSE (default ~/.cache/tfnet/wheelhouse), PYTHON311 (default /usr/bin/python3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:?usage: slim_venv_replica.sh NEW_VENV_DIR}
WH=${TFNET_WHEELHOUSE:-$HOME/.cache/tfnet/wheelhouse}/py311
PY=${PYTHON311:-/usr/bin/python3.11}
[ ! -e "$VENV" ] || { echo "$VENV exists; give a new folder" >&2; exit 1; }
[ -s "$WH/requirements.txt" ] || { echo "no wheelhouse at $WH: run scripts/docker_build.sh --wheelhouse-only" >&2; exit 1; }
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --no-index --find-links "$WH" -r "$WH/requirements.txt"
"$VENV/bin/pip" install --quiet --no-index --no-deps "$WH"/horovod/tf-*/horovod-*.whl
echo "[replica] before slimming: $(du -sb "$VENV" | cut -f1) bytes"
bash docker/slim_venv.sh "$VENV"
echo "[replica] after slimming: $(du -sb "$VENV" | cut -f1) bytes"
PYSPARK_PYTHON="$VENV/bin/python" SPARK_LOCAL_IP=127.0.0.1 TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" scripts/slim_venv_smoke.py
