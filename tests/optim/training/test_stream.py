"""Streaming a rank's rows from stored blocks (optim.data.stream) and the local copy they are stored in
(optim.data.spool), without Spark: the order against the in-memory dataset's, resuming mid-epoch,
the pipeline's errors, a full disk (a real tmpfs) and the sweep of a killed rank's files."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from optim.data import spool as sp
from optim.data import stream
from optim.data.arrays import ArrayDataset
from optim.data.decode import TensorColumns
from optim.errors import BadRowError, DataError, StorageError

X, Y = TensorColumns(("x",), (2,)), TensorColumns(("y",), None)


def rows(n, first=0):
    x = np.arange(first, first + n, dtype=np.float32)
    return np.stack([x, -x], axis=1), (np.arange(first, first + n) % 7).astype(np.int64)


def spooled(tmp_path, n, cuts=(5, 9, 1, 100), block_rows=8, name="t"):
    """``n`` rows written through Spark-like batches of ``cuts`` rows (cycled), as a SpoolFile."""
    w = sp.SpoolWriter(str(tmp_path / f"{name}.arrow"), block_rows)
    batches, first, k = [], 0, 0
    while first < n:
        m = min(cuts[k % len(cuts)], n - first)
        x, y = rows(m, first)
        batches.append(pa.record_batch({"x": pa.array(list(x), pa.list_(pa.float32())), "y": pa.array(y)}))
        first, k = first + m, k + 1
    for b in stream.numbered(batches):
        w.write(b)
    return w.finish()


def dataset(source, **kw):
    return stream.StreamedDataset(source, stream.Decoder([X], [Y], True, 3), **kw)


def as_rows(batches):
    return [b[0][0][:, 0].astype(int).tolist() for b in batches]


def test_blocks_do_not_depend_on_how_spark_cut_the_batches(tmp_path):
    a, b = spooled(tmp_path, 45, (5, 9, 1), name="a"), spooled(tmp_path, 45, (45,), name="b")
    assert a.block_rows == b.block_rows == [8, 8, 8, 8, 8, 5]
    for shuffle in (False, True):
        assert as_rows(dataset(a).batches(4, shuffle=shuffle, steps=20, seed=3)) == \
            as_rows(dataset(b).batches(4, shuffle=shuffle, steps=20, seed=3))


def test_unshuffled_batches_equal_the_in_memory_ones_with_wrap_around(tmp_path):
    """Without shuffling, the streamed batches are the in-memory ones bit for bit, with the equal-steps
    wrap-around (a short shard starts again) and the last short batch of an evaluation pass."""
    src = spooled(tmp_path, 45)
    x, y = rows(45)
    mem = ArrayDataset([x], [y], presharded=True)
    for kw in ({"steps": 17}, {"steps": 17, "skip": 5}, {}, {"drop_remainder": True}):
        got, want = list(dataset(src).batches(8, shuffle=False, **kw)), list(mem.batches(8, shuffle=False, **kw))
        assert len(got) == len(want) > 0
        for (gf, gl), (wf, wl) in zip(got, want):
            np.testing.assert_array_equal(gf[0], wf[0])
            np.testing.assert_array_equal(gl, wl)
            assert gf[0].dtype == wf[0].dtype


def test_the_shuffle_is_seeded_bounded_and_covers_every_row_each_pass(tmp_path):
    src = spooled(tmp_path, 45)
    ds = dataset(src, shuffle_buffer=16)
    one = as_rows(ds.batches(5, shuffle=True, seed=1, epoch=2, rank=1))
    assert one == as_rows(ds.batches(5, shuffle=True, seed=1, epoch=2, rank=1)), "same seed, same order"
    assert one != as_rows(ds.batches(5, shuffle=True, seed=1, epoch=3, rank=1)), "another epoch, another order"
    flat = sum(one, [])
    assert sorted(flat) == list(range(45)) and flat != list(range(45))
    # every window holds at least shuffle_buffer rows (but the last), made of whole blocks
    wins = list(stream.windows(src.block_rows, seed=1, epoch=2, rank=1, shuffle=True, shuffle_buffer=16))
    assert all(w.rows >= 16 for w in wins[:-1]) and sum(w.rows for w in wins) == 45
    assert sorted(b for w in wins for b in w.blocks) == list(range(6))
    # two passes of the equal-steps rule: each pass has every row once
    two = sum(as_rows(ds.batches(5, shuffle=True, seed=1, steps=18)), [])
    assert sorted(two[:45]) == sorted(two[45:]) == list(range(45)) and two[:45] != two[45:]


class CountingSource(stream.BlockSource):
    """A source whose reads are kept: the blocks read (``reads``) and the tables they gave (``tables``)."""

    def __init__(self, inner):
        self.inner, self.block_rows, self.reads, self.tables = inner, inner.block_rows, [], []

    def open(self):
        reader, reads, tables = self.inner.open(), self.reads, self.tables

        class Reader:
            def read(self, block):
                reads.append(block)
                tables.append(reader.read(block))
                return tables[-1]

            def close(self):
                reader.close()

        return Reader()


def test_a_resume_replays_the_order_and_does_not_read_the_batches_it_skips(tmp_path):
    src = CountingSource(spooled(tmp_path, 64))
    ds = dataset(src, shuffle_buffer=16)
    full = as_rows(ds.batches(4, shuffle=True, seed=5, steps=30))
    src.reads.clear()
    resumed = as_rows(ds.batches(4, shuffle=True, seed=5, steps=30, skip=12))
    assert resumed == full[12:]
    # batch 12 starts at row 48 of the pass: the three windows of 16 rows before it (6 blocks) are not read
    assert len(src.reads) == 8 * 2 - 6


def test_augmentation_is_seeded_per_batch_like_in_memory_data(tmp_path):
    src = spooled(tmp_path, 20)
    x, y = rows(20)

    def aug(features, rng):
        return [features[0] + rng.integers(0, 100, size=(len(features[0]), 1))]

    mem = ArrayDataset([x], [y], presharded=True, augment=aug)
    got = list(stream.StreamedDataset(src, stream.Decoder([X], [Y], True, 0), augment=aug).batches(
        6, shuffle=False, steps=5, skip=1, training=True, seed=2))
    want = list(mem.batches(6, shuffle=False, steps=5, skip=1, training=True, seed=2))
    for (gf, _), (wf, _) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gf[0], wf[0])


def test_an_undecodable_image_names_its_row_in_the_partition(tmp_path):
    import tensorflow as tf

    png = tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()
    images = [png] * 10
    images[7] = b"not an image"
    w = sp.SpoolWriter(str(tmp_path / "img.arrow"), 4)
    for b in stream.numbered([pa.record_batch({"img": pa.array(images, pa.binary()), "y": pa.array(range(10))})]):
        w.write(b)
    ds = stream.StreamedDataset(w.finish(), stream.Decoder([TensorColumns(("img",), (4, 4, 3))], [Y], True, 1))
    with pytest.raises(BadRowError, match=r"Column 'img' row 7 of partition 1: the image could not be decoded"):
        list(ds.batches(3, shuffle=True, seed=0))


def test_images_decoded_once_as_stored_give_the_batches_decoding_every_epoch_gives(tmp_path):
    """``decode_once``: a partition's PNG rows stored as pixels give, for a seeded epoch and for one resumed in its
    middle, exactly the batches (order, float32 pixels, labels) that storing them encoded and decoding every batch
    gives; pixels decoded at their own size are stored as uint8 (a quarter of float32's bytes), and a partition
    whose later part holds an image that had to be resized (float pixels) widens the copy to float32, as does one
    whose first part did: the batches stay the decoded ones; an image that does not decode is named as it is
    stored."""
    import tensorflow as tf

    from optim.data.partition import StreamShard

    rng = np.random.default_rng(0)
    images = [tf.io.encode_png(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).numpy() for _ in range(45)]
    larger = tf.io.encode_png(rng.integers(0, 255, (9, 7, 3), dtype=np.uint8)).numpy()  # resized: float pixels

    def parts(images):
        return [pa.record_batch({"img": pa.array(images[a:b], pa.binary()), "y": pa.array(np.arange(a, b))})
                for a, b in ((0, 13), (13, 30), (30, 45))]

    img = TensorColumns(("img",), (6, 5, 3))

    def stored(decode: bool, name: str, batches):
        reader = StreamShard((img,), (Y,), True, None, 16, 2, 8, decode_images=decode)
        return reader.spool(iter(batches), 1, str(tmp_path), name)

    def stored_type(ds):
        with pa.OSFile(ds.source.path, "rb") as f:
            return pa.ipc.open_file(f).schema.field("img").type.value_type

    cases = {"own size": (images, pa.uint8()), "a later part resized": (images[:20] + [larger] + images[21:], pa.float32()),
             "the first part resized": ([larger] + images[1:], pa.float32())}
    for case, (rows, kind) in cases.items():
        once, every = stored(True, "once", parts(rows)), stored(False, "every", parts(rows))
        assert stored_type(once) == kind, case
        if kind == pa.uint8():
            assert once.source.nbytes < 45 * 90 * 2, "uint8 pixels, not float32"
        for kw in ({"epoch": 0}, {"epoch": 3}, {"epoch": 3, "skip": 2}):
            a = list(once.batches(4, seed=5, shuffle=True, **kw))
            b = list(every.batches(4, seed=5, shuffle=True, **kw))
            assert len(a) == len(b) > 0
            for (fa, la), (fb, lb) in zip(a, b):
                # as decoded: uint8 where every image is at its size (cast inside the step's graph), else float32:
                # the stored copy for the whole partition, a batch decoded every epoch for itself
                assert fa[0].dtype == (np.uint8 if kind == pa.uint8() else np.float32), case
                assert fb[0].dtype == (np.float32 if not np.array_equal(fb[0], np.rint(fb[0])) else fb[0].dtype)
                assert fb[0].dtype == np.uint8 or kind != pa.uint8(), case
                np.testing.assert_array_equal(fa[0], fb[0], err_msg=case)
                np.testing.assert_array_equal(la, lb)
        if case != "own size":
            assert any(not np.array_equal(f[0], np.rint(f[0])) for f, _ in a), "a resized image's float pixels came back"
        once.release(), every.release()
    broken = [pa.record_batch({"img": pa.array(images[:4] + [b"not an image"], pa.binary()), "y": pa.array(range(5))})]
    with pytest.raises(BadRowError, match=r"Column 'img' row 4 of partition 1: the image could not be decoded"):
        stored(True, "broken", broken)


def test_the_pipeline_raises_the_producers_error_and_stops_when_dropped():
    import threading

    def broken():
        yield 1
        raise BadRowError("row 3 is bad")

    it = iter(stream.Prefetch(broken, depth=1))
    assert next(it) == 1
    with pytest.raises(BadRowError, match="row 3 is bad"):
        next(it)
    made = []

    def endless():
        while True:
            made.append(1)
            yield len(made)

    pre = stream.Prefetch(endless, depth=2, name="tfnet-test-endless")
    it = iter(pre)
    assert [next(it) for _ in range(3)] == [1, 2, 3]
    it.close()
    assert not any(t.name == "tfnet-test-endless" for t in threading.enumerate()), "the producer stopped"
    assert len(made) <= 3 + 2 + 1, "bounded by the prefetch depth"


def test_a_partition_streamed_for_evaluation_is_read_once(tmp_path):
    x, y = rows(10)
    batches = [pa.record_batch({"x": pa.array(list(x[:7]), pa.list_(pa.float32())), "y": pa.array(y[:7])}),
               pa.record_batch({"x": pa.array(list(x[7:]), pa.list_(pa.float32())), "y": pa.array(y[7:])})]
    ds = stream.ArrowStream(iter(batches), stream.Decoder([X], [Y], True, 0))
    assert as_rows(ds.batches(4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(DataError, match="A partition streamed for evaluation is read once"):
        list(ds.batches(4))


def test_a_full_disk_is_a_storage_error_naming_the_folder_and_the_bytes_and_leaves_nothing(tiny_tmpfs):
    folder = sp.spool_folder(str(tiny_tmpfs))
    big = [pa.record_batch({"x": pa.array([bytes(4000)] * 8, pa.binary())})] * 4  # 128 KB, twice the disk
    with pytest.raises(StorageError, match=rf"{folder} is full \(No space left on device\); it needed at least "
                                           r"\d+ bytes \(\d+ written, \d+ more for the next block\)") as caught:
        sp.spool(stream.numbered(big), folder, {"train": "run-r0-a0"}, lambda b: {"train": b}, block_rows=4)
    assert not caught.value.retryable and isinstance(caught.value, OSError)
    assert os.listdir(folder) == [], "nothing left behind"


def test_the_sweep_removes_only_files_whose_process_is_gone(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    for name in (f"tfnet-run-r1-a0-pid{dead_pid}.arrow", f"tfnet-run-r1-a0-pid{dead_pid}.arrow.part",
                 f"tfnet-run-r0-a1-pid{os.getpid()}.arrow", "someone-else.arrow"):
        (tmp_path / name).write_bytes(b"x")
    assert sorted(sp.sweep(str(tmp_path))) == [f"tfnet-run-r1-a0-pid{dead_pid}.arrow",
                                               f"tfnet-run-r1-a0-pid{dead_pid}.arrow.part"]
    assert sorted(os.listdir(tmp_path)) == sorted([f"tfnet-run-r0-a1-pid{os.getpid()}.arrow", "someone-else.arrow"])


def test_a_spool_that_fails_midway_removes_every_file(tmp_path):
    def route(batch):
        if batch.column(0)[0].as_py() >= 20:
            raise BadRowError("row 20 is bad")
        return {"train": batch, "val": batch}

    batches = [pa.record_batch({"x": pa.array(range(i, i + 10))}) for i in (0, 10, 20)]
    with pytest.raises(BadRowError, match="row 20 is bad"):
        sp.spool(stream.numbered(batches), str(tmp_path), {"train": "a", "val": "a-val"}, route, block_rows=4)
    assert os.listdir(tmp_path) == []


def pixel_rows(tmp_path, n, bad=None):
    """``n`` random 32x32x3 images stored as the local copy stores decoded pixels (uint8, given back as float32);
    row ``bad``, if any, one value short."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (n, 32 * 32 * 3)).astype(np.float32)
    field, column = stream.pixel_column("img", pixels)
    if bad is not None:
        values = [list(r) for r in pixels.astype(np.uint8)]
        values[bad] = values[bad][:-1]
        column, field = pa.array(values, pa.list_(pa.uint8())), pa.field("img", pa.list_(pa.uint8()), metadata=field.metadata)
    w = sp.SpoolWriter(str(tmp_path / f"px{bad}.arrow"), 16)
    for b in stream.numbered([pa.record_batch([column, pa.array(np.arange(n))],
                                              schema=pa.schema([field, pa.field("y", pa.int64())]))]):
        w.write(b)
    return w.finish(), pixels.reshape(n, 32, 32, 3)


class CountingDecoder(stream.Decoder):
    def __init__(self, *a):
        super().__init__(*a)
        self.calls = 0

    def __call__(self, table):
        self.calls += 1
        return super().__call__(table)


def test_small_batches_are_decoded_several_at_a_time_and_equal_the_ones_decoded_alone(tmp_path):
    """The producer decodes consecutive small batches in one call and cuts them apart: the batches (order,
    float32 pixels, labels) equal those of one decode a batch, for a seeded epoch, a resumed one and the
    equal-steps rule, with fewer decodes than batches."""
    src, pixels = pixel_rows(tmp_path, 200)
    img = TensorColumns(("img",), (32, 32, 3))

    def batches(grouped, **kw):
        decoder = CountingDecoder([img], [Y], True, 0)
        ds = stream.StreamedDataset(src, decoder, shuffle_buffer=64)
        if not grouped:
            ds.max_decode_batches = 1
        return list(ds.batches(6, seed=4, shuffle=True, **kw)), decoder.calls

    for kw in ({"epoch": 1}, {"epoch": 1, "skip": 7}, {"epoch": 2, "steps": 40, "skip": 3}):
        (grouped, calls), (alone, one_calls) = batches(True, **kw), batches(False, **kw)
        assert len(grouped) == len(alone) == one_calls > 0 and calls < one_calls / 4, (calls, one_calls)
        for (gf, gl), (af, al) in zip(grouped, alone):
            assert gf[0].dtype == np.float32 and gf[0].shape[1:] == (32, 32, 3)
            np.testing.assert_array_equal(gf[0], af[0])
            np.testing.assert_array_equal(gf[0], pixels[gl])  # each row's own pixels
            np.testing.assert_array_equal(gl, al)


def test_a_bad_row_in_a_group_comes_after_the_batches_before_it(tmp_path):
    """A row that cannot become a tensor, in a group decoded in one call: the batches before its own come out
    first, as one decode a batch gives them, then its BadRowError, naming it; and a check of every batch
    (``on_batch``) that fails hands over the batches before it first too."""
    src, pixels = pixel_rows(tmp_path, 40, bad=13)
    img = TensorColumns(("img",), (32, 32, 3))
    got = []
    with pytest.raises(BadRowError, match=r"Column 'img' row 13 of partition 2 has 3071 values; expected 3072"):
        for batch in stream.StreamedDataset(src, stream.Decoder([img], [Y], True, 2)).batches(4, shuffle=False):
            got.append(batch)
    assert [b[1].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    np.testing.assert_array_equal(got[2][0][0], pixels[8:12])

    good, _ = pixel_rows(tmp_path, 40)

    def check(batch, index, rows):
        if index == 5:
            raise DataError(f"batch {index} (rows {rows.tolist()}) failed its check")
        return batch

    got = []
    with pytest.raises(DataError, match=r"batch 5 \(rows \[20, 21, 22, 23\]\) failed its check"):
        for batch in stream.StreamedDataset(good, stream.Decoder([img], [Y], True, 2), on_batch=check).batches(
                4, shuffle=False):
            got.append(batch)
    assert [b[1].tolist()[0] for b in got] == [0, 4, 8, 12, 16]


def test_a_window_is_copied_once_and_its_uint8_pixels_reach_the_batches_as_they_are(tmp_path):
    """Pixels stored as uint8 come out as uint8 (the step casts them inside its graph), each row copied once after
    its block is read: the batches of a window, across the groups decoded apart, are views of one buffer that is
    none of the blocks'. Before, the window's take, each group's concatenation and its cast to float32 each made
    a copy. A resumed epoch gives the same rows."""
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8)
    field, column = stream.pixel_column("img", pixels)
    assert field.metadata[stream.PIXELS_KEY] == b"uint8"
    w = sp.SpoolWriter(str(tmp_path / "px.arrow"), 16)
    for b in stream.numbered([pa.record_batch([column, pa.array(np.arange(200))],
                                              schema=pa.schema([field, pa.field("y", pa.int64())]))]):
        w.write(b)
    src = CountingSource(w.finish())
    img = TensorColumns(("img",), (32, 32, 3))
    decoder = CountingDecoder([img], [Y], True, 0)
    ds = stream.StreamedDataset(src, decoder, shuffle_buffer=96)
    got = list(ds.batches(6, seed=2, epoch=1, shuffle=True))
    assert len(got) == 34 and decoder.calls < len(got)
    seen = np.concatenate([labels for _, labels in got])
    assert sorted(seen.tolist()) == list(range(200))  # every row once
    for features, labels in got:
        assert features[0].dtype == np.uint8
        np.testing.assert_array_equal(features[0], pixels[labels])
        assert not any(np.shares_memory(features[0], np.asarray(t.column("img").chunk(0).flatten()))
                       for t in src.tables)
    # a window of 96 rows: its 16 whole batches, decoded in more than one group, lie one after the other in the
    # buffer of one gather
    first_window = [f[0] for f, _ in got[:16]]
    address = [f.__array_interface__["data"][0] for f in first_window]
    assert all(a + f.nbytes == b for a, f, b in zip(address, first_window, address[1:])), address
    resumed = list(ds.batches(6, seed=2, epoch=1, shuffle=True, skip=5))
    assert [r.tolist() for _, r in resumed] == [r.tolist() for _, r in got[5:]]
