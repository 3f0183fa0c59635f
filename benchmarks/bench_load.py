"""Load time of a ResNet-50 frozen graph (.pb, 224x224, 1000 classes, weights=None) into TFNet,
beside TensorFlow's own way of loading the same file, in the same run.

    python benchmarks/bench_load.py [--json out.json] [--rounds 3]

The .pb is frozen with TensorFlow's converter (``convert_variables_to_constants_v2``), the
standard TF 2 recipe. Timed, each in a fresh ``tf.Graph``/function, alternating:

* ``tfnet load``: ``TFNet.from_frozen_graph(path, ...)`` (read, weights to variables, statistics
  detection, batch-norm folding, static shapes);
* ``tfnet load + first forward``: the same, then the first ``forward`` on one image (tracing);
* ``tf baseline``: read the GraphDef, ``tf.compat.v1.wrap_function`` + ``import_graph_def`` +
  ``prune`` (what one writes by hand to call a frozen graph in TF 2), then the first call.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, interleaved, machine, median, peak_rss_mb, setup_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup_env()
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    from tfnet import TFNet

    info = machine()
    print(banner())
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, 224, 224, 3], tf.float32, name="x")
    )
    frozen = convert_variables_to_constants_v2(fn)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "resnet50.pb")
    with open(path, "wb") as f:
        f.write(frozen.graph.as_graph_def().SerializeToString())
    size_mb = os.path.getsize(path) / 2**20
    inputs, outputs = [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]
    del frozen
    x = np.random.default_rng(0).normal(size=(1, 224, 224, 3)).astype(np.float32)

    def tfnet_load():
        TFNet.from_frozen_graph(path, inputs, outputs)

    def tfnet_load_forward():
        TFNet.from_frozen_graph(path, inputs, outputs).forward(x)

    def tf_baseline():
        graph_def = tf.compat.v1.GraphDef()
        with open(path, "rb") as f:
            graph_def.ParseFromString(f.read())
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        call = wrapped.prune(wrapped.graph.get_tensor_by_name(inputs[0]), wrapped.graph.get_tensor_by_name(outputs[0]))
        call(tf.constant(x))

    times = interleaved(
        {"tfnet load": tfnet_load, "tfnet load + first forward": tfnet_load_forward, "tf baseline": tf_baseline},
        rounds=args.rounds,
    )
    result = {"machine": info, "pb_mb": size_mb, "seconds": {k: median(v) for k, v in times.items()},
              "all": times, "peak_rss_mb": peak_rss_mb()}
    print(f"ResNet-50 .pb: {size_mb:.1f} MB, median of {args.rounds} rounds (after 1 warm-up):")
    base = result["seconds"]["tf baseline"]
    for name, s in result["seconds"].items():
        print(f"  {name:28s} {s:6.2f} s   ({s / base:.2f}x the TF baseline)")
    print(f"peak RSS {result['peak_rss_mb']:.0f} MB")
    finish(args.json, result)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
