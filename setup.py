"""tfnet: fine-tune and run frozen TensorFlow graphs over Apache Spark."""

from setuptools import find_packages, setup

# Only the packages: no top-level module and no .pth file, so installing tfnet changes no other
# program's start-up. tfnet keeps TensorFlow's start-up banner out of stderr where it imports
# TensorFlow itself (tfnet/quiet.py).
INSTALL_REQUIRES = [
    "tensorflow-cpu==2.21.*",
    # TensorFlow's (and onnx's) numpy types. 0.7.0's import registers its types' ufunc loops one by one, each a
    # linear scan of the ufunc's loops in numpy (PyUFunc_AddLoop): 1.2 s of CPU in every process that imports
    # TensorFlow (Spark daemons, drivers, rank processes), against 6 ms for 0.6.0 (docs/benchmarks.md, 2026-12-02)
    "ml_dtypes>=0.5.4,<0.7",
    "pyspark>=4.1,<5",  # TFPredictor runs its model in an Arrow UDF (pyspark.sql.functions.arrow_udf, Spark 4.1)
    "numpy>=1.26",
    "pyarrow>=11",
    "pandas>=2.0,<3",
    # Horovod's Python runtime needs these; Horovod itself is built by scripts/build_horovod.sh.
    "pyyaml",
    "cloudpickle",
    "psutil",
    "packaging",
    "tqdm>=4.60",
    # TFOptimizer(model_dir=...) writes TensorBoard events
    "tensorboard",
    # model_dir, exports and TFPredictor paths as URIs (tfnet.storage); each scheme's file system is an extra
    "fsspec>=2024.6",
]

EXTRAS = {
    # real object stores for the tests, each with its client: S3 (moto_server lands in .venv/bin) and GCS
    # (gcp-storage-emulator); Azure's (Azurite) is an npm package, which scripts/install.sh installs
    "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "scikit-learn>=1.4", "ruff>=0.6", "moto[server]>=5", "s3fs>=2024.6",
             "boto3", "gcp-storage-emulator>=2024.8", "gcsfs>=2024.6", "adlfs>=2024.4",
             # the onnx whose conformance cases tests/fixtures/onnx_conformance_passing.txt lists (its first line)
             "onnx==1.23.2"],
    # model_dir on object stores and HDFS (fsspec's implementations; credentials from the usual places)
    "s3": ["s3fs>=2024.6"],
    # TFDataset.from_delta: Delta Lake tables read through delta-rs (no Spark connector, no JVM jars)
    "delta": ["deltalake>=1.1,<2"],
    # optim.callbacks.MLflowLogger: experiment tracking (imported only when the logger is used)
    "mlflow": ["mlflow>=3.1,<4"],
    "gcs": ["gcsfs>=2024.6"],
    "azure": ["adlfs>=2024.4"],
    "hdfs": [],  # fsspec's hdfs:// runs on pyarrow's HadoopFileSystem (needs libhdfs and a Hadoop client)
    # a Spark Connect client (SparkSession.builder.remote(...)): pyspark[connect]'s packages beside
    # TensorFlow's grpcio; the tests start a real Connect server
    "connect": ["grpcio>=1.76", "grpcio-status>=1.76", "googleapis-common-protos>=1.71", "zstandard>=0.25"],
    "openvino": ["openvino>=2025.0"],
    # INT8 post-training quantisation for TFPredictor (precision="int8"); apart from `openvino` so that
    # the cluster image stays within its size bound (docker/README.md)
    "quantize": ["openvino>=2025.0", "nncf>=3.4"],
    # ONNX import and export (TFNet.from_onnx / save_onnx); onnxruntime is the tests' oracle
    "onnx": ["onnx>=1.16", "onnxruntime>=1.18"],
    "examples": ["matplotlib>=3.8"],
}
# what `make` installs: everything
EXTRAS["all"] = sorted({r for reqs in EXTRAS.values() for r in reqs})

setup(
    name="tfnet",
    version="0.1.0",
    description="Fine-tune and run frozen TensorFlow graphs over Apache Spark with Horovod",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # The repository's examples/ installs as `tfnet_examples`, a name of tfnet's own (a top-level
    # `examples` would collide with other distributions that ship one).
    packages=find_packages(include=["tfnet", "tfnet.*", "optim", "optim.*"]) + ["tfnet_examples", "tfnet_examples.resnet50"],
    package_dir={"tfnet_examples": "examples"},
    entry_points={"console_scripts": ["tfnet-resnet50=tfnet_examples.resnet50.train:cli",
                                      "tfnet-main=tfnet_examples.main_job:cli"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
