"""What a streamed rank's input thread costs per batch: decoded 64x64x3 pixels in the local copy as float32 (what
``decode_once`` stored before) against uint8 (what it stores now where exact), side by side, alternating.

No Spark and no model: the rows are written to two spool files as the rank writes them, and each side's shuffled
epochs are read through :class:`optim.data.stream.StreamedDataset` (the producer thread, the window's permutation,
the batch's decode to float32), as many batches as a rank of ``--rows`` rows makes in ``--epochs`` epochs.

    PYTHONPATH=. python benchmarks/bench_producer.py [--rows 2000] [--epochs 3] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, interleaved, machine, median, write_json  # noqa: E402

SIZE = 64
BATCH = 16


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import numpy as np
    import pyarrow as pa

    from optim.data import spool, stream
    from optim.data.decode import TensorColumns

    print(banner(), flush=True)
    width = SIZE * SIZE * 3
    pixels = np.random.default_rng(0).integers(0, 256, (args.rows, width), np.uint8)
    image, label = TensorColumns(("image",), (SIZE, SIZE, 3)), TensorColumns(("label",), None)
    folder = tempfile.mkdtemp(prefix="tfnet-bench-producer-")
    datasets = {}
    for name, dtype in (("float32 copy", np.float32), ("uint8 copy", np.uint8)):
        writer = spool.SpoolWriter(spool.spool_path(folder, name.split()[0]))
        for a in range(0, args.rows, 100):
            column = pa.FixedSizeListArray.from_arrays(pa.array(pixels[a:a + 100].astype(dtype).ravel()), width)
            field = pa.field("image", column.type, metadata={stream.PIXELS_KEY: b"float32"})
            part = pa.record_batch([column, pa.array(np.arange(a, a + len(column)) % 10)],
                                   schema=pa.schema([field, pa.field("label", pa.int64())]))
            for numbered in stream.numbered([part], a):
                writer.write(numbered)
        datasets[name] = stream.StreamedDataset(writer.finish(), stream.Decoder([image], [label], True, 0))
    checks = {}

    def epochs(name):
        def run():
            last = None
            for e in range(args.epochs):
                for features, _ in datasets[name].batches(BATCH, epoch=e, seed=0, shuffle=True):
                    last = features[0]
            checks[name] = last
        return run

    times = interleaved({name: epochs(name) for name in datasets}, rounds=args.rounds)
    batches = args.epochs * -(-args.rows // BATCH)
    ms = {name: 1e3 * median(t) / batches for name, t in times.items()}
    assert all(v.dtype == np.float32 for v in checks.values())
    np.testing.assert_array_equal(*checks.values())  # the same batches either way
    sizes = {name: ds.source.nbytes for name, ds in datasets.items()}
    for name, v in ms.items():
        print(f"  {name}: {v:.3f} ms a batch of {BATCH} (file {sizes[name] / 1e6:.1f} MB)")
    ratio = ms["float32 copy"] / ms["uint8 copy"]
    print(f"uint8 copy is {ratio:.2f}x faster a batch than the float32 copy")
    for ds in datasets.values():
        ds.release()
    results = {"machine": machine(), "command": "python benchmarks/bench_producer.py " + " ".join(argv or sys.argv[1:]),
               "args": vars(args), "ms_per_batch": ms, "file_bytes": sizes, "float32_over_uint8": ratio}
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
