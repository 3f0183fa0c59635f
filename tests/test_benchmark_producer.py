"""benchmarks/bench_producer.py's step side, small, as issue 57's figures are made: its streamed datasets (a
subclass of :class:`optim.data.stream.StreamedDataset` that stands for a rank's data) go through
``TFOptimizer.optimize`` as the benchmark drives them. Its ``bind`` fell behind the base class's signature once (the
``output_names`` argument) and ``--step`` failed on its first call, unseen until a developer ran it on a new CPU."""

import sys

import numpy as np

from tests.benchmark_files import load


def test_the_streamed_sides_train_and_the_cast_inside_the_graph_is_exact(tmp_path, monkeypatch):
    import optim
    from optim import TFOptimizer

    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmarks put their folder first; not for later tests
    producer, memory = load("bench_producer"), load("bench_memory")
    rows = 64
    pixels = np.random.default_rng(0).integers(0, 256, (rows, producer.SIZE * producer.SIZE * 3), np.uint8)
    labels = np.arange(rows) % 10
    sources = {"widened": producer.spooled(str(tmp_path), "u8f", pixels, labels, np.uint8),
               "uint8": producer.spooled(str(tmp_path), "u8", pixels, labels, np.uint8, given="uint8")}
    weights, first = {}, None
    for name, source in sources.items():
        opt = TFOptimizer(memory.small_cnn(), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                          optim.SGD(0.01))
        first = first or [v.copy() for v in opt.net.get_weights().values()]
        opt.optimize(producer.streamed(source, grouped=True), epochs=1, batch_size=producer.BATCH, verbose=0)
        assert len([t for t in opt.last_run["step_times"] if t is not None]) == rows // producer.BATCH
        weights[name] = list(opt.net.get_weights().values())  # two nets: Keras numbers their layers' names
        source.release()
    for a, b in zip(weights["uint8"], weights["widened"], strict=True):  # uint8 cast in the graph: the same weights
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(weights["uint8"], first, strict=True))
