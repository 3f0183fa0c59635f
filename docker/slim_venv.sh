#!/usr/bin/env bash
# Slims the image's venv (from docker/install_venv.sh in the Dockerfile's runtime stage, after Horovod is
# installed) by removing what the runtime never uses. Each step saves tens to hundreds of MB:
#   - TensorFlow's C++ headers (tensorflow/include; only Horovod's build reads them);
#   - test suites (`tests` folders; not TensorFlow's own, which its modules import);
#   - libclang (a TensorFlow build-time dependency, not imported at run time);
#   - OpenVINO's GPU and NPU plugins (a CPU image; its CPU plugin stays), and libs/cache.json (9 MB:
#     the GPU plugin's kernel tuning cache, which only that plugin reads);
#   - Spark jars for what a tfnet cluster never starts: RocksDB (the streaming state store and the
#     history server's disk store), the Scala REPL and compiler (spark-shell), the Spark Connect Scala
#     client's REPL (connect-repl/), and Hive (enableHiveSupport, the Thrift server; the default catalog
#     is in memory). YARN and Kubernetes stay: docker/README.md describes both. hive-storage-api stays:
#     ORC reads through it. Spark Connect's server jar (spark-connect_*.jar) stays, so that a Connect
#     server runs in the image and the Python client (grpcio-status, googleapis-common-protos,
#     zstandard, in the wheelhouse) reaches it. With Hive go the jars only Hive used (JDO, Thrift, JPAM,
#     ANTLR 3 and StringTemplate, Javolution, Super CSV, StAX), and Netty's native libraries for the
#     platforms the image is not (macOS, Windows, other Linux architectures than the build's);
#   - ONNX's backend test data (onnx/backend/test: 17 MB of models and protobufs);
#   - pyarrow's Flight RPC, its C++ test library, headers and Cython sources;
#   - TensorBoard's data server (a binary only `tensorboard --logdir` serves with; writing events
#     does not need it);
#   - OpenVINO's frontends for formats tfnet never hands it (Paddle, JAX, GGUF, TF Lite, ONNX, PyTorch:
#     tfnet gives OpenVINO TensorFlow graphs and its own IR; TFNet.from_onnx converts ONNX itself), the
#     Python bindings of those frontends, and OpenVINO's C++ headers;
#   - TensorFlow's StableHLO Python extension (compiler/mlir/stablehlo: jax2tf's, imported only when
#     asked for), the tf2xla op library that no Python module loads (compiler/tf2xla/ops/_xla_ops.so:
#     libtensorflow_cc registers the XLA ops the Python wrappers call) and the sources of tfcompile's
#     AOT runtime (xla_aot_runtime_src);
#   - TensorBoard's web UI (webfiles.zip: like the data server, only `tensorboard --logdir` serves it);
#   - ONNX's backend test suite (onnx/backend/test: the conformance cases a backend is tested with);
#   - copies of one shared library that wheels ship because they cannot hold symlinks (pyarrow's
#     libarrow_python three times, libgfortran in numpy.libs and scipy.libs): symlinks to one copy;
#   - botocore's service models but S3's and STS's (botocore/data: 27 MB, 430 services; s3fs talks to
#     S3, and STS is where assumed-role and web-identity credentials come from; the endpoint,
#     partition, retry and default-configuration files at its top stay);
#   - zstandard's cffi backend (12 MB; it needs the cffi package, which is not installed: zstandard
#     loads its C backend);
#   - static symbol tables (`strip --strip-unneeded`, which keeps the dynamic symbols other libraries
#     link against) of every shared library in the venv: TensorFlow's, Horovod's (built with -g),
#     Arrow's, zstandard's (11 MB of debug info), aiohttp's and the rest; not those that auditwheel
#     vendored into `*.libs` folders (patched by patchelf, which strip can undo badly).
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
      "$SP"/openvino/libs/libopenvino_{paddle,jax,gguf,tensorflow_lite}_frontend.so.* "$SP"/openvino/libs/cache.json
J="$SP/pyspark/jars"
rm -rf "$J"/rocksdbjni-*.jar "$J"/scala-compiler-*.jar "$J"/spark-repl_*.jar "$J"/jline-*.jar \
       "$J"/connect-repl "$J"/spark-hive_*.jar "$J"/spark-hive-thriftserver_*.jar \
       "$J"/hive-beeline-*.jar "$J"/hive-cli-*.jar "$J"/hive-common-*.jar "$J"/hive-exec-*.jar "$J"/hive-jdbc-*.jar \
       "$J"/hive-metastore-*.jar "$J"/hive-serde-*.jar "$J"/hive-service-rpc-*.jar "$J"/hive-shims-*.jar \
       "$J"/datanucleus-*.jar "$J"/derby*.jar \
       "$J"/javax.jdo-*.jar "$J"/jdo-api-*.jar "$J"/transaction-api-*.jar "$J"/libthrift-*.jar "$J"/jpam-*.jar \
       "$J"/antlr-runtime-3.*.jar "$J"/ST4-*.jar "$J"/javolution-*.jar "$J"/super-csv-*.jar "$J"/stax-api-*.jar
arch=$(uname -m | sed 's/aarch64/aarch_64/')
for jar in "$J"/netty-*-osx-*.jar "$J"/netty-*-windows-*.jar "$J"/netty-*-linux-*.jar; do
    case "$jar" in *"-linux-$arch.jar") ;; *) rm -f "$jar" ;; esac
done
rm -rf "$SP"/pyarrow/include "$SP"/pyarrow/src "$SP"/pyarrow/_flight.* "$SP"/pyarrow/libarrow_flight.so* \
       "$SP"/pyarrow/libarrow_python_flight.so* "$SP"/pyarrow/_pyarrow_cpp_tests.*
find "$SP/pyarrow" \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' \) -delete
"$VENV/bin/pip" uninstall --quiet -y tensorboard-data-server
rm -rf "$SP"/onnx/backend/test
rm -rf "$SP"/openvino/include "$SP"/openvino/libs/libopenvino_{onnx,pytorch}_frontend.so.* \
       "$SP"/openvino/frontend/{onnx,pytorch,paddle,jax,tensorflow_lite}
rm -rf "$SP"/tensorflow/compiler/mlir/stablehlo/stablehlo_extension.so "$SP"/tensorflow/compiler/tf2xla/ops/_xla_ops.so \
       "$SP"/tensorflow/xla_aot_runtime_src "$SP"/tensorboard/webfiles.zip
find "$SP/botocore/data" -mindepth 1 -maxdepth 1 -type d ! -name s3 ! -name sts -exec rm -rf {} +
rm -f "$SP"/zstandard/_cffi.*.so
# every ELF shared library outside the *.libs folders
find "$SP" -type d -name '*.libs' -prune -o -type f \( -name '*.so' -o -name '*.so.*' \) -print0 \
    | while IFS= read -r -d '' lib; do
        if [ "$(head -c 4 "$lib" | od -An -c | tr -d ' ')" = '177ELF' ]; then strip --strip-unneeded "$lib"; fi
    done
# identical copies of one library: symlinks to the copy the loader asks for by name (relative, so the venv can move)
same_as() {  # same_as COPY TARGET: COPY becomes a link to TARGET when both hold the same bytes
    if [ -f "$1" ] && [ ! -L "$1" ] && [ -f "$2" ] && cmp -s "$1" "$2"; then
        ln -sf "$(realpath --relative-to="$(dirname "$1")" "$2")" "$1"
    fi
}
for lib in "$SP"/pyarrow/libarrow_python*.so.[0-9]*; do
    case "$lib" in *.so.*.*) continue ;; esac  # the SONAME (libarrow_python.so.2600) stays a file
    same_as "${lib%.so.*}.so" "$lib"
    for full in "$lib".*; do same_as "$full" "$lib"; done
done
for lib in "$SP"/scipy.libs/libgfortran-*.so*; do same_as "$lib" "$SP/numpy.libs/$(basename "$lib")"; done
# the slimmed venv must still work
"$VENV/bin/python" -c "import tensorflow as tf, horovod.tensorflow as hvd, pyarrow.compute, pandas, pyspark, sklearn, openvino; \
assert hvd.gloo_built(); assert float(tf.reduce_sum(tf.ones(3))) == 3.0; assert 'CPU' in openvino.Core().available_devices; \
import pyarrow.fs, pyarrow.dataset, pyarrow.parquet, tensorboard.summary, onnx.version_converter, onnx.checker; \
import scipy.linalg, sklearn.linear_model, pyarrow.lib; from openvino import convert_model; \
import s3fs, botocore.session; session = botocore.session.get_session(); \
[session.create_client(n, region_name='us-east-1', aws_access_key_id='k', aws_secret_access_key='s') for n in ('s3', 'sts')]; \
import zstandard, pyspark.sql.connect.session; from pyspark.sql.connect import utils as cu; \
[f() for f in (cu.require_minimum_grpc_version, cu.require_minimum_grpcio_status_version, \
               cu.require_minimum_googleapis_common_protos_version, cu.require_minimum_zstandard_version)]"
ls "$J"/spark-connect_*.jar >/dev/null
echo "[slim_venv] $VENV: ${before} MB -> $(du -sm "$VENV" | cut -f1) MB"
