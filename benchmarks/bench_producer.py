"""What a streamed rank's input costs per batch, and what it takes from the step that shares the rank's core.

(a) **The producer alone** (no model): decoded 64x64x3 pixels in the local copy as float32 (what ``decode_once``
    stored before issue 43), a batch a decode; the uint8 copy (what it stores where exact) given to the step as
    float32 (the widening before issue 57), and given as uint8, as it is now (the step casts inside its graph),
    both several small batches a decode (``decoded_groups``). Each side's shuffled epochs go through
    :class:`optim.data.stream.StreamedDataset` (the producer thread, the window's gather, the decode), as many
    batches as a rank of ``--rows`` rows makes in ``--epochs`` epochs. It prints the bytes of a batch's features
    handed to the step.
(b) **The step beside it, on one core** (``--step``): the small CNN of ``bench_input.py`` trained locally by
    ``TFOptimizer.optimize`` at a batch of 16 (a rank's share of ``bench_input.py``'s global 32), TensorFlow on one
    thread and the process pinned to one core, as a Spark rank of one task CPU is: the rows in memory as float32
    and as uint8 (the baselines), and streamed from the uint8 copy, widened to float32 and as uint8. The img/s of
    the steps (from one step's end to the next, the wait for input included), medians of the rounds, sides
    alternating.

No Spark: the rows are written to spool files as a rank writes them. The batches of every side are asserted equal
(values; the dtypes differ), and the two streamed sides of (b) end with the same weights, bit for bit.

    PYTHONPATH=. python benchmarks/bench_producer.py [--rows 2000] [--epochs 3] [--rounds 3] [--step]
                                                      [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, setup_env  # noqa: E402

SIZE = 64
BATCH = 16


def spooled(folder: str, name: str, pixels, labels, dtype, given: str = "float32"):
    """``pixels`` (uint8 rows) stored as ``dtype`` in a local copy, as a rank stores decoded images, and given to
    the step as ``given``."""
    import numpy as np
    import pyarrow as pa

    from optim.data import spool, stream

    width = pixels.shape[1]
    writer = spool.SpoolWriter(spool.spool_path(folder, name))
    for a in range(0, len(pixels), 100):
        column = pa.FixedSizeListArray.from_arrays(pa.array(pixels[a:a + 100].astype(dtype).ravel()), width)
        field = pa.field("image", column.type, metadata={stream.PIXELS_KEY: given.encode()})
        part = pa.record_batch([column, pa.array(labels[a:a + 100])],
                               schema=pa.schema([field, pa.field("label", pa.int64())]))
        for numbered in stream.numbered([part], a):
            writer.write(numbered)
    source = writer.finish()
    assert np.dtype(dtype) == np.float32 or source.nbytes < pixels.nbytes * 2
    return source


def streamed(source, grouped: bool):
    """A StreamedDataset over ``source`` whose batches are decoded in groups, or a batch a decode; trained on in
    this process as a rank trains on one (a rank's data is checked on the driver, before it is staged)."""
    from optim.data import stream
    from optim.data.decode import TensorColumns

    class RankData(stream.StreamedDataset):
        def bind(self, input_names, input_specs, output_names=None) -> None:
            pass

        def checked(self, loss, net, on_nonfinite, where, training=True):
            return self

    decoder = stream.Decoder([TensorColumns(("image",), (SIZE, SIZE, 3))], [TensorColumns(("label",), None)], True, 0)
    dataset = RankData(source, decoder)
    if not grouped:
        dataset.max_decode_batches = 1
    return dataset


def producer_alone(datasets: dict, args) -> dict:
    import numpy as np

    checks = {}

    def epochs(name):
        def run():
            seen, last = [], None
            for e in range(args.epochs):
                for features, labels in datasets[name].batches(BATCH, epoch=e, seed=0, shuffle=True):
                    seen.append(labels)
                    last = features[0]
            checks[name] = (last, np.concatenate(seen))
        return run

    times = interleaved({name: epochs(name) for name in datasets}, rounds=args.rounds)
    batches = args.epochs * -(-args.rows // BATCH)
    ms = {name: 1e3 * median(t) / batches for name, t in times.items()}
    first = next(iter(checks.values()))
    for features, labels in checks.values():  # the same batches, in the same order, every side
        np.testing.assert_array_equal(features, first[0])
        np.testing.assert_array_equal(labels, first[1])
    print("(a) the producer alone, ms a batch of 16 (medians):")
    handed = {}
    for name, v in ms.items():
        handed[name] = int(checks[name][0].nbytes)
        print(f"  {name:36s} {v:.3f} ms (file {datasets[name].source.nbytes / 1e6:.1f} MB; a batch's features handed "
              f"to the step: {handed[name] / 1024:.0f} KiB, {checks[name][0].dtype})")
    now = ms["uint8 copy as uint8, grouped"]
    print(f"  float32 copy, a batch a decode / uint8 copy as uint8: {ms['float32 copy, a batch a decode'] / now:.2f}x; "
          f"uint8 copy as float32 / as uint8 (grouped): {ms['uint8 copy as float32, grouped'] / now:.2f}x")
    return {"ms_per_batch": ms, "batch_bytes": handed}


def step_beside(source, pixels, labels, args) -> dict:
    """(b): img/s of the steps on one core, memory against streamed a batch a decode and in groups."""
    import numpy as np
    import tensorflow as tf
    from bench_memory import small_cnn

    import optim
    from optim import TFOptimizer
    from optim.data.arrays import ArrayDataset

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    narrow = pixels.reshape(len(pixels), SIZE, SIZE, 3)
    images = narrow.astype(np.float32)
    widened, given = source
    sides = {"in memory, float32": lambda: ArrayDataset([images], [labels], presharded=True),
             "in memory, uint8": lambda: ArrayDataset([narrow], [labels], presharded=True),
             "streamed, widened to float32": lambda: streamed(widened, grouped=True),
             "streamed, uint8": lambda: streamed(given, grouped=True)}
    opts = {name: TFOptimizer(small_cnn(), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                              optim.SGD(0.01)) for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in (list(sides) if r % 2 else list(sides)[::-1]):
            opts[name].optimize(sides[name](), epochs=args.epochs, batch_size=BATCH, verbose=0)
            times = [t for t in opts[name].last_run["step_times"][1:] if t is not None]
            if r:
                rates[name].append(BATCH * len(times) / sum(times))
    one, grouped = (list(opts[name].net.get_weights().values()) for name in ("streamed, widened to float32",
                                                                              "streamed, uint8"))
    for a, b in zip(one, grouped, strict=True):  # the cast inside the graph is exact: the same weights, bit for bit
        np.testing.assert_array_equal(a, b)
    out = {name: median(v) for name, v in rates.items()}
    base = out["in memory, float32"]
    print(f"(b) the step beside the producer, one core, img/s of the steps (medians of {args.rounds} rounds):")
    for name, v in out.items():
        print(f"  {name:30s} {v:9.1f} img/s  {v / base:.3f} of in memory (float32)   rounds "
              f"{[round(x) for x in rates[name]]}")
    print(f"  streamed uint8 / in memory uint8: {out['streamed, uint8'] / out['in memory, uint8']:.3f}")
    return {"img_s": out, "rounds": rates, "of_memory": {name: v / base for name, v in out.items()},
            "streamed_of_memory_uint8": out["streamed, uint8"] / out["in memory, uint8"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step", action="store_true", help="also (b): the step beside the producer on one core")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env()
    import numpy as np

    print(banner(), flush=True)
    pixels = np.random.default_rng(0).integers(0, 256, (args.rows, SIZE * SIZE * 3), np.uint8)
    labels = np.arange(args.rows) % 10
    folder = tempfile.mkdtemp(prefix="tfnet-bench-producer-")
    f32 = spooled(folder, "f32", pixels, labels, np.float32)
    u8f = spooled(folder, "u8f", pixels, labels, np.uint8)
    u8 = spooled(folder, "u8", pixels, labels, np.uint8, given="uint8")
    datasets = {"float32 copy, a batch a decode": streamed(f32, False), "uint8 copy as float32, grouped": streamed(u8f, True),
                "uint8 copy as uint8, grouped": streamed(u8, True)}
    alone = producer_alone(datasets, args)
    results = {"machine": machine(), "command": "python benchmarks/bench_producer.py " + " ".join(argv or sys.argv[1:]),
               "args": vars(args), **alone}
    if args.step:
        results["step_on_one_core"] = step_beside((u8f, u8), pixels, labels, args)
    f32.release(), u8f.release(), u8.release()
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
