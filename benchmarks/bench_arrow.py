"""The one Arrow reader (``optim.arrow.read_column``) against the two readers it replaced and
against pyarrow's unchecked conversion.

Columns (built in code, float32 arrays of 784 values per row, as MNIST-sized images):

* training: ``read_column(..., on_bad="raise")`` against the old ``optim.training.shard._column_to_numpy``;
* prediction: ``read_column(...)`` (collect) against the old ``optim.predict.arrow.column_to_array``,
  on clean rows and with 1% bad rows (nulls and short arrays);
* both against the floor: ``col.flatten().to_numpy().reshape(...)``, which checks nothing.

The old readers are loaded from ``git show <rev>:<path>`` (``--baseline-rev``, default the commit
before issue 11's Arrow work); without git they are left out. Every side runs in this one process,
in alternation, after a warm-up; the median time per round gives the ratio (old / new: above 1
means the unified reader is faster).

    python benchmarks/bench_arrow.py [--rows 20000] [--rounds 9] [--baseline-rev ec9387a] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def old_module(rev: str, path: str, name: str):
    """The module at ``path`` as it was at ``rev``, or None when git cannot show it."""
    try:
        source = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], capture_output=True, text=True,
                                check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up there
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def columns(rows: int, size: int):
    import numpy as np
    import pyarrow as pa

    values = np.random.default_rng(0).random(rows * size, dtype=np.float32)
    clean = pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * size), pa.array(values))
    lists = clean.to_pylist()
    for i in range(0, rows, 100):  # 1% bad rows: nulls and short arrays, alternating
        lists[i] = None if (i // 100) % 2 else lists[i][:10]
    return clean, pa.array(lists, pa.list_(pa.float32()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--baseline-rev", default="ec9387a")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import pyarrow as pa

    from optim.arrow import ColumnRead, read_column
    from optim.predict.columns import InputColumn
    from optim.predict.snapshot import TensorInfo

    size = 784
    clean, dirty = columns(args.rows, size)
    batch = pa.record_batch({"x": clean})
    spec = InputColumn("x", TensorInfo("x:0", "float32", (28, 28, 1)), "array", 1)
    shape = (28, 28, 1)
    old_shard = old_module(args.baseline_rev, "optim/training/shard.py", "old_shard")
    old_arrow = old_module(args.baseline_rev, "optim/predict/arrow.py", "old_arrow")

    fns = {
        "floor: pyarrow flatten+reshape": lambda: clean.flatten().to_numpy().reshape((len(clean),) + shape),
        "training: read_column raise": lambda: read_column(clean, ColumnRead(shape=shape), on_bad="raise"),
        "prediction: read_column collect": lambda: read_column(clean, spec.reading),
        "prediction 1% bad: read_column collect": lambda: read_column(dirty, spec.reading),
    }
    if old_shard is not None:
        fns["training: old shard._column_to_numpy"] = lambda: old_shard._column_to_numpy(batch, "x", shape, 0, 0)
    if old_arrow is not None:
        fns["prediction: old column_to_array"] = lambda: old_arrow.column_to_array(clean, spec, {})
        fns["prediction 1% bad: old column_to_array"] = lambda: old_arrow.column_to_array(dirty, spec, {})
    times = {name: median(t) for name, t in interleaved(fns, args.rounds).items()}

    info = machine()
    print(banner())
    print(f"{args.rows} rows x {size} float32 per row, median of {args.rounds} rounds")
    mb = args.rows * size * 4 / 1e6
    for name, t in times.items():
        print(f"  {name:45s} {t * 1e3:8.2f} ms  {mb / t:8.0f} MB/s")
    ratios = {}
    floor = times["floor: pyarrow flatten+reshape"]
    for name in ("training: read_column raise", "prediction: read_column collect"):
        ratios[f"{name} / floor"] = times[name] / floor
    pairs = [("training: old shard._column_to_numpy", "training: read_column raise"),
             ("prediction: old column_to_array", "prediction: read_column collect"),
             ("prediction 1% bad: old column_to_array", "prediction 1% bad: read_column collect")]
    for old, new in pairs:
        if old in times:
            ratios[f"{old} / {new}"] = times[old] / times[new]
    for name, r in ratios.items():
        print(f"  ratio {name}: {r:.2f}")
    finish(args.json, {"machine": info, "rows": args.rows, "seconds": times, "ratios": ratios})


if __name__ == "__main__":
    main()
