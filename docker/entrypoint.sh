#!/usr/bin/env bash
# Entrypoint of the tfnet cluster image. Also runs outside Docker (tests/optim/spark/test_cluster.py uses it so).
#
#   entrypoint.sh master              a Spark standalone master (foreground)
#   entrypoint.sh worker              a Spark standalone worker (foreground)
#   entrypoint.sh main [ARGS...]      the digits main job (tfnet-main) against the master
#   entrypoint.sh resnet50 [ARGS...]  the ResNet-50 job (tfnet-resnet50) against the master
#   entrypoint.sh submit [ARGS...]    the same as resnet50 (the name older set-ups use)
#   entrypoint.sh predict [ARGS...]   TFPredictor over a DataFrame (docker/predict_job.py)
#   entrypoint.sh connect [ARGS...]   a Spark Connect server, an application of the master (foreground; ARGS: spark-submit options)
#   entrypoint.sh run CMD [ARGS...]   any command, with the same environment (a driver of your own)
#
# Settings (environment): SPARK_MASTER_HOST (0.0.0.0), SPARK_MASTER_PORT (7077),
# SPARK_MASTER_WEBUI_PORT (8080), SPARK_MASTER_URL (spark://spark-master:7077),
# SPARK_WORKER_CORES (1), SPARK_WORKER_MEMORY (2g), SPARK_WORKER_WEBUI_PORT (8081),
# SPARK_WORKER_HOST (this host's name), SPARK_WORKER_DIR (/tmp/spark-work),
# SPARK_LOCAL_IP (in a container: its own address, which the drivers advertise to the executors),
# SPARK_CONNECT_PORT (15002; the Connect server listens on every address of its host),
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
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "entrypoint: Java 17 is needed (apt-get install -y openjdk-17-jre-headless)" >&2
    exit 1
fi
# In a container, drivers must advertise an address the executors can reach: the container's own.
if [ -z "${SPARK_LOCAL_IP:-}" ] && [ -f /.dockerenv ]; then
    SPARK_LOCAL_IP=$(hostname -i | awk '{print $1}')
    export SPARK_LOCAL_IP
fi

# a console script of the Python in use (PYTHON's folder first, then PATH)
script() {
    local dir
    dir=$(dirname "$(command -v "$PYTHON")")
    if [ -x "$dir/$1" ]; then echo "$dir/$1"; else command -v "$1" || { echo "entrypoint: $1 not found" >&2; exit 1; }; fi
}

# The class-data archive of Spark's classes that the image's JVMs map (docker/Dockerfile's JRE_OPTIONS name it):
# unpacked once per container, before its first JVM. Where it is missing (outside the image) or cannot be
# unpacked, JVMs start as before.
CLASS_ARCHIVE=/tmp/tfnet-spark.jsa
unpack_class_archive() {
    local packed=${JAVA_HOME:-/opt/java}/lib/spark.jsa.zst
    if [ ! -f "$packed" ] || [ -f "$CLASS_ARCHIVE" ]; then
        return 0
    fi
    if zstd -q -d -f "$packed" -o "$CLASS_ARCHIVE.$$" 2>/dev/null; then
        mv -f "$CLASS_ARCHIVE.$$" "$CLASS_ARCHIVE"
    else
        rm -f "$CLASS_ARCHIVE.$$"
        echo "entrypoint: could not unpack $packed into $CLASS_ARCHIVE; Java starts without the class-data archive" >&2
    fi
}

role=${1:-help}
shift || true
case "$role" in
    master|worker|main|resnet50|submit|predict|connect|run) unpack_class_archive ;;
esac
MASTER_URL=${SPARK_MASTER_URL:-spark://spark-master:7077}
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
        exec "$SPARK_CLASS" org.apache.spark.deploy.worker.Worker "$MASTER_URL" "${args[@]}" "$@"
        ;;
    main)
        exec "$(script tfnet-main)" --master "$MASTER_URL" "$@"
        ;;
    resnet50|submit)
        exec "$(script tfnet-resnet50)" --master "$MASTER_URL" "$@"
        ;;
    predict)
        job="$HERE/predict_job.py"
        [ -f "$job" ] || job=/usr/local/share/tfnet/predict_job.py
        exec "$PYTHON" "$job" --master "$MASTER_URL" "$@"
        ;;
    connect)
        # the Connect server is the application's driver: its executors run on the workers, with the
        # image's Python (PYSPARK_PYTHON), forked with TensorFlow imported (optim.spark.worker_daemon: a
        # client cannot set it); clients reach it on SPARK_CONNECT_PORT
        args=(--master "$MASTER_URL" --conf spark.connect.grpc.binding.address=0.0.0.0
              --conf spark.python.daemon.module=optim.spark.worker_daemon
              --conf "spark.connect.grpc.binding.port=${SPARK_CONNECT_PORT:-15002}")
        if [ -n "${SPARK_LOCAL_IP:-}" ]; then
            args+=(--conf "spark.driver.host=$SPARK_LOCAL_IP")
        fi
        exec "$SPARK_HOME/bin/spark-submit" "${args[@]}" "$@" \
            --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal
        ;;
    run)
        exec "$@"
        ;;
    help|-h|--help)
        sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        ;;
    *)
        echo "entrypoint: unknown role '$role'; expected master, worker, main, resnet50, submit, predict, connect or run" >&2
        exit 2
        ;;
esac
