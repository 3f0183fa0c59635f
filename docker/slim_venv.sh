#!/usr/bin/env bash
# Slims the image's venv (in the Dockerfile's builder stage, after Horovod is installed) by removing
# what the runtime never uses. Each step saves tens to hundreds of MB:
#   - TensorFlow's C++ headers (tensorflow/include; only Horovod's build reads them);
#   - test suites (`tests` folders; not TensorFlow's own, which its modules import);
#   - libclang (a TensorFlow build-time dependency, not imported at run time);
#   - OpenVINO's GPU and NPU plugins (a CPU image; its CPU plugin stays);
#   - Spark jars for what a tfnet cluster never starts: RocksDB (the streaming state store and the
#     history server's disk store), the Scala REPL and compiler (spark-shell), Spark Connect's server,
#     and Hive (enableHiveSupport, the Thrift server; the default catalog is in memory). YARN and
#     Kubernetes stay: docker/README.md describes both. hive-storage-api stays: ORC reads through it;
#   - ONNX's backend test data (onnx/backend/test: 17 MB of models and protobufs);
#   - pyarrow's Flight RPC, its C++ test library, headers and Cython sources;
#   - TensorBoard's data server (a binary only `tensorboard --logdir` serves with; writing events
#     does not need it);
#   - OpenVINO's frontends for formats tfnet never hands it (Paddle, JAX, GGUF, TF Lite);
#   - static symbol tables of the largest shared libraries (`strip --strip-unneeded` keeps the dynamic
#     symbols other libraries link against): TensorFlow's, Horovod's (built with -g) and Arrow's.
#
#   docker/slim_venv.sh /opt/venv
set -euo pipefail
VENV=${1:?usage: slim_venv.sh VENV}
SP=$(echo "$VENV"/lib/python3*/site-packages)
before=$(du -sm "$VENV" | cut -f1)

rm -rf "$SP/tensorflow/include" "$SP/pyspark/examples"
find "$SP" -mindepth 2 -type d -name tests -not -path "$SP/tensorflow/*" -prune -exec rm -rf {} +
"$VENV/bin/pip" uninstall --quiet -y libclang
rm -f "$SP"/openvino/libs/libopenvino_intel_gpu_plugin.so "$SP"/openvino/libs/libopenvino_intel_npu_plugin.so \
      "$SP"/openvino/libs/libopenvino_{paddle,jax,gguf,tensorflow_lite}_frontend.so.*
J="$SP/pyspark/jars"
rm -rf "$J"/rocksdbjni-*.jar "$J"/scala-compiler-*.jar "$J"/spark-repl_*.jar "$J"/jline-*.jar \
       "$J"/spark-connect_*.jar "$J"/connect-repl "$J"/spark-hive_*.jar "$J"/spark-hive-thriftserver_*.jar \
       "$J"/hive-beeline-*.jar "$J"/hive-cli-*.jar "$J"/hive-common-*.jar "$J"/hive-exec-*.jar "$J"/hive-jdbc-*.jar \
       "$J"/hive-metastore-*.jar "$J"/hive-serde-*.jar "$J"/hive-service-rpc-*.jar "$J"/hive-shims-*.jar \
       "$J"/datanucleus-*.jar "$J"/derby*.jar
rm -rf "$SP"/pyarrow/include "$SP"/pyarrow/src "$SP"/pyarrow/_flight.* "$SP"/pyarrow/libarrow_flight.so* \
       "$SP"/pyarrow/libarrow_python_flight.so* "$SP"/pyarrow/_pyarrow_cpp_tests.*
find "$SP/pyarrow" \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' \) -delete
"$VENV/bin/pip" uninstall --quiet -y tensorboard-data-server
rm -rf "$SP"/onnx/backend/test/data
for lib in "$SP"/tensorflow/libtensorflow_cc.so.2 "$SP"/tensorflow/libtensorflow_framework.so.2 \
           "$SP"/tensorflow/python/profiler/internal/_pywrap_profiler_plugin.so \
           "$SP"/horovod/tensorflow/mpi_lib.cpython-*.so "$SP"/pyarrow/libarrow*.so.*; do
    [ -f "$lib" ] && strip --strip-unneeded "$lib"
done
# the slimmed venv must still work
"$VENV/bin/python" -c "import tensorflow as tf, horovod.tensorflow as hvd, pyarrow.compute, pandas, pyspark, sklearn, openvino; \
assert hvd.gloo_built(); assert float(tf.reduce_sum(tf.ones(3))) == 3.0; assert 'CPU' in openvino.Core().available_devices; \
import pyarrow.fs, pyarrow.dataset, pyarrow.parquet, tensorboard.summary, onnx.version_converter, onnx.checker"
echo "[slim_venv] $VENV: ${before} MB -> $(du -sm "$VENV" | cut -f1) MB"
