"""The cluster image, built from a clean clone by scripts/docker_build.sh (the venv installed in the stage that
ships it, from the host-made wheelhouse): small enough, no compilers, not root, and everything imports."""

import pytest

from tests.docker.compose import sh

# the first test of a fresh machine also installs Docker, makes the base image, the wheelhouse and the image
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

# The target: 2.0 GB or less (the image with OpenVINO, scikit-learn, ONNX, s3fs, the Spark Connect
# client and server, and compiled bytecode was 1.96 GB, 2% under it: a jlink'd Java runtime, no matplotlib,
# unused Spark jars dropped, every shared library stripped). Issue 34's cuts in docker/slim_venv.sh take 67 MB
# more (measured on a replica of the builder's venv): about 1.89 GB, 5.5% under the bound (docs/benchmarks.md).
MAX_IMAGE_BYTES = 2.0e9


def run_in_image(image: str, *cmd: str) -> str:
    return sh(["docker", "run", "--rm", image, "run", *cmd], timeout=300).stdout


def test_image_builds_from_a_clean_clone(image_build):
    image = image_build["image"]
    size = int(sh(["docker", "image", "inspect", "-f", "{{.Size}}", image], timeout=60).stdout)
    print(f"\n{image}: built in {image_build['seconds']:.0f} s, {size / 1e9:.3f} GB, "
          f"{1 - size / MAX_IMAGE_BYTES:.1%} under the bound")
    assert size <= MAX_IMAGE_BYTES, f"{image} is {size / 1e9:.2f} GB; the bound is {MAX_IMAGE_BYTES / 1e9} GB"
    assert sh(["docker", "image", "inspect", "-f", "{{.Config.User}}", image], timeout=60).stdout.strip() == "tfnet"
    assert run_in_image(image, "id", "-u").strip() == "1000"
    # no compiler, cmake or Python headers in the runtime stage
    found = run_in_image(image, "sh", "-c", "for t in gcc cc c++ g++ cmake make; do command -v $t; done; "
                                            "ls /usr/include/python3.11 2>/dev/null; true")
    assert found.strip() == "", f"build tools left in the image: {found}"
    out = run_in_image(image, "python", "-c", (
        "from tfnet import TFNet; from optim import TFOptimizer, TFPredictor; import horovod.tensorflow as h; "
        "import pyspark, sklearn, openvino; print('gloo', h.gloo_built(), 'spark', pyspark.__version__)"))
    assert "gloo True spark 4." in out, out
    assert "openjdk" in sh(["docker", "run", "--rm", image, "run", "java", "-version"], timeout=120).stderr.lower()


# a model written with onnx's own helpers (not by tfnet), run in the image and checked against numpy
ONNX_IN_IMAGE = """
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from tfnet import TFNet
rng = np.random.default_rng(0)
w = rng.standard_normal((4, 3)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [numpy_helper.from_array(w, "w")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(model)
net = TFNet.from_onnx(model)
x = rng.standard_normal((5, 4)).astype(np.float32)
print("max_diff", float(np.abs(np.asarray(net.forward(x)) - np.maximum(x @ w, 0)).max()))
"""


def test_image_loads_an_onnx_model(image_build):
    out = run_in_image(image_build["image"], "python", "-c", ONNX_IN_IMAGE)
    assert float(out.split("max_diff")[-1]) < 1e-5, out


def _shared_classes(*docker_run: str) -> int:
    """How many classes ``java -version`` loads from a class-data archive, run by ``docker run --rm *docker_run``."""
    out = sh(["docker", "run", "--rm", *docker_run, "-Xlog:class+load=info", "-version"], timeout=120).stdout
    return out.count("source: shared objects file")


def test_every_jvm_maps_the_jdks_archive_and_sparks_where_the_entrypoint_unpacked_it(image_build):
    """The JRE's default options name the JDK's own class-data archive and, on top of it, Spark's, which the entrypoint
    unpacks into the container's /tmp (docker/class_archive.py; the compose cluster's tests check that every JVM there
    maps it). A JVM started without the entrypoint finds no Spark archive and still maps the JDK's (an option that
    named the missing archive alone turned class sharing off altogether: 0 classes)."""
    image = image_build["image"]
    assert run_in_image(image, "sh", "-c", "test -s /tmp/tfnet-spark.jsa && echo unpacked").strip() == "unpacked"
    assert _shared_classes(image, "run", "java") > 300
    assert "tfnet-spark.jsa" not in sh(["docker", "run", "--rm", "--entrypoint", "ls", image, "/tmp"], timeout=60).stdout
    assert _shared_classes("--entrypoint", "/opt/java/bin/java", image) > 300
