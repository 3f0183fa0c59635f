#!/usr/bin/env bash
# Entrypoint of the tfnet cluster image. Also runs outside Docker (the tests use it that way).
#
#   entrypoint.sh master            start a Spark standalone master (foreground)
#   entrypoint.sh worker            start a Spark standalone worker (foreground)
#   entrypoint.sh submit [ARGS...]  run the ResNet-50 job against the master
#
# Settings (environment): SPARK_MASTER_HOST (0.0.0.0), SPARK_MASTER_PORT (7077),
# SPARK_MASTER_WEBUI_PORT (8080), SPARK_MASTER_URL (spark://spark-master:7077),
# SPARK_WORKER_CORES (1), SPARK_WORKER_MEMORY (2g), SPARK_WORKER_WEBUI_PORT (8081),
# SPARK_WORKER_HOST (this host's name), SPARK_WORKER_DIR (/tmp/spark-work),
# PYTHON (python3): the Python with tfnet installed, also used by the workers.
set -euo pipefail

PYTHON=${PYTHON:-python3}
if [ -z "${SPARK_HOME:-}" ]; then
    SPARK_HOME=$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
fi
export SPARK_HOME
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v "$PYTHON")}
export TF_ENABLE_ONEDNN_OPTS=${TF_ENABLE_ONEDNN_OPTS:-1}
SPARK_CLASS="$SPARK_HOME/bin/spark-class"

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "entrypoint: Java 17 is needed (apt-get install -y openjdk-17-jre-headless)" >&2
    exit 1
fi

role=${1:-}
shift || true
case "$role" in
    master)
        exec "$SPARK_CLASS" org.apache.spark.deploy.master.Master \
            --host "${SPARK_MASTER_HOST:-0.0.0.0}" \
            --port "${SPARK_MASTER_PORT:-7077}" \
            --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}" "$@"
        ;;
    worker)
        args=(--cores "${SPARK_WORKER_CORES:-1}" --memory "${SPARK_WORKER_MEMORY:-2g}"
              --webui-port "${SPARK_WORKER_WEBUI_PORT:-8081}" --work-dir "${SPARK_WORKER_DIR:-/tmp/spark-work}")
        if [ -n "${SPARK_WORKER_HOST:-}" ]; then
            args+=(--host "$SPARK_WORKER_HOST")
        fi
        exec "$SPARK_CLASS" org.apache.spark.deploy.worker.Worker "${SPARK_MASTER_URL:-spark://spark-master:7077}" \
            "${args[@]}" "$@"
        ;;
    submit)
        exec "$PYTHON" -m examples.resnet50.train --master "${SPARK_MASTER_URL:-spark://spark-master:7077}" "$@"
        ;;
    *)
        echo "usage: entrypoint.sh master|worker|submit [ARGS...]" >&2
        exit 2
        ;;
esac
