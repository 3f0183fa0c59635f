"""The one Arrow reader (optim.arrow): every column kind, bad rows, and both policies.

The columns are built with pyarrow in code; the expected values come from numpy on the same
Python lists (and from TensorFlow's own PNG encoder for images)."""

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from optim.arrow import ColumnRead, read_column
from optim.data.decode import TensorColumns, arrow_to_arrays
from optim.errors import BadRowError, ColumnError

ROWS = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], [0.5] * 6]


@pytest.mark.parametrize("arrow_type", [pa.list_(pa.float64()), pa.large_list(pa.float64()),
                                        pa.list_(pa.float64(), 6)], ids=["list", "large_list", "fixed_size_list"])
def test_flat_arrays_reshaped_with_dtype_as_stored_or_given(arrow_type):
    col = pa.array(ROWS, arrow_type)
    values, bad = read_column(col, ColumnRead(shape=(2, 3)))
    assert bad == {} and values.dtype == np.float64
    np.testing.assert_array_equal(values, np.array(ROWS).reshape(3, 2, 3))
    values, _ = read_column(col.slice(1, 2), ColumnRead(shape=(6,), dtype="float32"))  # a slice: offsets from 1
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, np.array(ROWS[1:], np.float32))
    values, _ = read_column(col)  # no shape: the first row's length
    assert values.shape == (3, 6)


def test_nested_arrays_checked_per_dimension_and_shape_inferred():
    rows = [np.arange(6.0).reshape(2, 3).tolist(), (np.arange(6.0) + 10).reshape(2, 3).tolist()]
    col = pa.array(rows, pa.list_(pa.list_(pa.float32())))
    values, bad = read_column(col)
    assert bad == {} and values.shape == (2, 2, 3) and values.dtype == np.float32
    np.testing.assert_array_equal(values, np.array(rows, np.float32))
    fixed = pa.array(rows, pa.list_(pa.list_(pa.float32(), 3), 2))
    np.testing.assert_array_equal(read_column(fixed, ColumnRead(shape=(2, 3))).values, np.array(rows, np.float32))
    ragged = pa.array([rows[0], [[1.0, 2.0], [3.0, 4.0, 5.0, 6.0]]], pa.list_(pa.list_(pa.float32())))
    _, bad = read_column(ragged, ColumnRead(shape=(2, 3)))
    assert [(r, p.what, p.text) for r, p in bad.items()] == [
        (1, "dimension", "dimension 1 has length 2, expected 3 (per-row shape (2, 3))")]
    with pytest.raises(ColumnError, match=r"Column 'v' is nested 2 deep, but the per-row shape is \(2, 3, 1\); "
                                          r"use a flat array or one nested 3 deep\."):
        read_column(col, ColumnRead(shape=(2, 3, 1)), column="v")


def test_scalars_of_every_numeric_type():
    ints = read_column(pa.array([1, 2, 3], pa.int64())).values
    assert ints.dtype == np.int64 and ints.tolist() == [1, 2, 3]
    assert read_column(pa.array([True, False])).values.tolist() == [True, False]
    shaped = read_column(pa.array([1.5, 2.5], pa.float32()), ColumnRead(shape=(1,), dtype="float64")).values
    assert shaped.shape == (2, 1) and shaped.dtype == np.float64
    decimals = read_column(pa.array([Decimal("1.25"), Decimal("2.50")], pa.decimal128(5, 2))).values
    assert decimals.dtype == np.float64 and decimals.tolist() == [1.25, 2.5]


def test_strings_and_bytes_become_object_arrays():
    values, bad = read_column(pa.array(["a", None, "ccc"]))
    assert values.dtype == object and values.tolist() == ["a", b"", "ccc"]
    assert {r: p.text for r, p in bad.items()} == {1: "the value is null"}
    raw = read_column(pa.array([b"\x00\x01", b""], pa.binary())).values  # no image shape: bytes
    assert raw.tolist() == [b"\x00\x01", b""]


def test_images_decoded_to_the_shape_and_bad_images_named():
    tf = pytest.importorskip("tensorflow")
    pixels = np.random.default_rng(0).integers(0, 256, (2, 5, 4, 3), dtype=np.uint8)
    pngs = [tf.io.encode_png(p).numpy() for p in pixels]
    col = pa.array(pngs + [None, b"not an image"], pa.binary())
    values, bad = read_column(col, ColumnRead(shape=(5, 4, 3), dtype="uint8"))
    np.testing.assert_array_equal(values[:2], pixels)
    assert values.dtype == np.uint8 and not values[2:].any()
    assert bad[2].what == "null" and bad[3].what == "image"
    assert bad[3].text.startswith("the image could not be decoded (12 bytes; JPEG, PNG, GIF, BMP or WebP expected, or "
                                  "60 bytes of raw uint8 pixels)")
    with pytest.raises(BadRowError, match=r"Column 'img' row 5 of partition 1: the image could not be decoded "
                                          r"\(12 bytes"):
        read_column(col.slice(3), ColumnRead(shape=(5, 4, 3)), on_bad="raise", column="img", partition=1,
                    row_offset=5)
    with pytest.raises(ColumnError, match=r"Column 'img' holds encoded images, which need a per-row shape \(height, "
                                          r"width, channels\) with 1, 3 or 4 channels\. Received: shape=\(5, 4\)"):
        read_column(col, ColumnRead(kind="image", shape=(5, 4)), column="img")


def test_raw_uint8_pixels_of_the_shape_are_taken_as_they_are():
    """Bytes of exactly height x width x channels that are no image file are raw pixels (a uint8 image's
    ``tobytes()``), even when they happen to start like one (``BM``: a BMP's magic)."""
    pixels = np.random.default_rng(1).integers(0, 256, (3, 5, 4, 3), dtype=np.uint8)
    pixels[1, 0, 0, :2] = [ord("B"), ord("M")]
    values, bad = read_column(pa.array([p.tobytes() for p in pixels] + [bytes(59)], pa.binary()),
                              ColumnRead(shape=(5, 4, 3)))
    assert values.dtype == np.uint8 and not bad.keys() - {3}  # as decoded: the graph casts them
    np.testing.assert_array_equal(values[:3], pixels)
    as_float, _ = read_column(pa.array([p.tobytes() for p in pixels], pa.binary()), ColumnRead(shape=(5, 4, 3),
                                                                                               dtype="float32"))
    assert as_float.dtype == np.float32
    np.testing.assert_array_equal(as_float, pixels.astype(np.float32))
    assert bad[3].text.startswith("the image could not be decoded (59 bytes; JPEG, PNG, GIF, BMP or WebP expected, or "
                                  "60 bytes of raw uint8 pixels)")



@pytest.mark.parametrize("binary", [pa.binary(), pa.large_binary()], ids=["binary", "large_binary"])
def test_raw_pixels_are_read_as_one_view_and_equal_row_by_row(binary, monkeypatch):
    """A binary column of raw pixels (how decoded images cross Arrow at a byte a value) is read as one view of its
    buffer and converted once: equal, value for value, to reading it row by row, in a slice of a column too (as a
    prediction's batch is); only the rows that start like an image file go through the per-row decoder. Before,
    every row did (a Python ``bytes`` copy of each image first)."""
    import optim.arrow as arrow

    pixels = np.random.default_rng(2).integers(0, 256, (9, 6, 5, 3), dtype=np.uint8)
    pixels[2, 0, 0, :2] = [ord("B"), ord("M")]  # starts like a BMP: tried as a file, then raw
    pixels[4, 0, 0, :3] = [0xFF, 0xD8, 0xFF]  # starts like a JPEG
    col = pa.array([p.tobytes() for p in pixels], binary)
    calls = []
    decode = arrow.decode_image
    monkeypatch.setattr(arrow, "decode_image", lambda data, *a, **k: calls.append(data) or decode(data, *a, **k))
    for part, rows in ((col, slice(None)), (col.slice(1, 5), slice(1, 6))):
        calls.clear()
        values, bad = read_column(part, ColumnRead(shape=(6, 5, 3), dtype="float32"))
        assert bad == {} and values.dtype == np.float32
        np.testing.assert_array_equal(values, pixels[rows].astype(np.float32))
        assert sorted(calls) == sorted(pixels[i].tobytes() for i in (2, 4)), len(calls)
    as_uint8, _ = read_column(col, ColumnRead(shape=(6, 5, 3), dtype="uint8"))
    np.testing.assert_array_equal(as_uint8, pixels)
    # a null, or a row of another size, and the rows are read one by one, as before
    calls.clear()
    values, bad = read_column(pa.array([pixels[0].tobytes(), None], binary), ColumnRead(shape=(6, 5, 3)))
    assert bad[1].what == "null" and len(calls) == 1
    np.testing.assert_array_equal(values[0], pixels[0].astype(np.float32))


BAD = pa.array([[1.0] * 6, [1.0, 2.0, 3.0], None, [1.0, None, 3.0, 4.0, 5.0, 6.0], [2.0] * 6],
               pa.list_(pa.float64()))


def test_collect_policy_returns_every_bad_row_and_zeros():
    values, bad = read_column(BAD, ColumnRead(shape=(6,), tensor="v:0"))
    assert {r: (p.what, p.text) for r, p in bad.items()} == {
        1: ("length", "the array has 3 values; input 'v:0' needs 6 (per-row shape (6,))"),
        2: ("null", "the value is null"),
        3: ("element_null", "the array holds a null value"),
    }
    assert (bad[1].got, bad[1].want, bad[1].shape) == (3, 6, (6,))
    np.testing.assert_array_equal(values, [[1.0] * 6, [0] * 6, [0] * 6, [0] * 6, [2.0] * 6])


@pytest.mark.parametrize("start, match", [
    (0, r"Column 'x' row 7 of partition 2 has 3 values; expected 6 \(per-row shape \(6,\)\)\.$"),
    (2, r"Column 'x' is null at row 8 of partition 2; every training row needs a value\.$"),
    (3, r"Column 'x' row 9 of partition 2: the array holds a null value\.$"),
])
def test_raise_policy_names_the_first_bad_row(start, match):
    with pytest.raises(BadRowError, match=match):
        read_column(BAD.slice(start), ColumnRead(shape=(6,)), on_bad="raise", column="x", partition=2,
                    row_offset=6 + start)
    assert issubclass(BadRowError, ValueError)


@pytest.mark.parametrize("col, type_name", [
    (pa.array([{"a": 1}]), "struct<a: int64>"),
    (pa.array([["a", "b"]]), "list<item: string>"),
])
def test_columns_of_other_types_are_refused(col, type_name):
    with pytest.raises(ColumnError, match=rf"Column 'c' has type {type_name}; tensors come from numeric columns, "
                                          "arrays of numbers, binary columns of encoded images"):
        read_column(col, column="c")


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`on_bad` must be 'raise' or 'collect'. Received: on_bad='skip'"):
        read_column(pa.array([1]), on_bad="skip")
    with pytest.raises(ValueError, match=r"`kind` must be one of .*Received: kind='vector'"):
        read_column(pa.array([1]), ColumnRead(kind="vector"))


def test_chunked_columns_are_combined():
    chunked = pa.chunked_array([pa.array([[1, 2]], pa.list_(pa.int32())), pa.array([[3, 4]], pa.list_(pa.int32()))])
    assert read_column(chunked).values.tolist() == [[1, 2], [3, 4]]


def test_training_shard_reads_nested_arrays_stacks_scalars_and_counts_rows_across_batches():
    """The training side: rows are numbered within the partition across its Arrow batches."""
    nested = [np.full((2, 2), i, np.float32).tolist() for i in range(4)]
    batches = [pa.record_batch({"x": pa.array(nested[a:b], pa.list_(pa.list_(pa.float32()))),
                                "a": pa.array([1.0 * i for i in range(a, b)]), "b": pa.array(range(a, b))})
               for a, b in ((0, 3), (3, 4))]
    x, ab = arrow_to_arrays(batches, [TensorColumns(("x",), (2, 2)), TensorColumns(("a", "b"), (2,))], 0)
    np.testing.assert_array_equal(x, np.array(nested, np.float32))
    np.testing.assert_array_equal(ab, [[0, 0], [1, 1], [2, 2], [3, 3]])
    bad = pa.record_batch({"x": pa.array([nested[0], None], pa.list_(pa.list_(pa.float32())))})
    with pytest.raises(BadRowError, match=r"Column 'x' is null at row 5 of partition 1"):
        arrow_to_arrays([batches[0].select(["x"]), batches[1].select(["x"]), bad], [TensorColumns(("x",))], 1)


def test_training_shard_decodes_an_image_column():
    tf = pytest.importorskip("tensorflow")
    pixels = np.random.default_rng(1).integers(0, 256, (3, 4, 5, 1), dtype=np.uint8)
    batch = pa.record_batch({"img": pa.array([tf.io.encode_png(p).numpy() for p in pixels], pa.binary())})
    (images,) = arrow_to_arrays([batch], [TensorColumns(("img",), (4, 5, 1))], 0)
    assert images.dtype == np.uint8  # as decoded, a quarter of float32's bytes in a rank's memory
    np.testing.assert_array_equal(images, pixels)
