"""tfnet's one container format (net bytes, rank 0's result, checkpoints)."""

import numpy as np
import pytest

from tfnet.container import ContainerError, pack, unpack


def test_round_trip_and_checks():
    arrays = {"w00000": np.arange(6, dtype=np.float32).reshape(2, 3), "s00000": np.array(3, np.int64)}
    data = pack("demo-1", {"step": 3}, arrays)
    header, got = unpack(data, "demo-1")
    assert header["step"] == 3 and header["format"] == "demo-1" and len(header["sha256"]) == 64
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
    with pytest.raises(ContainerError, match=r"x: expected format 'other-1', received 'demo-1'"):
        unpack(data, "other-1", what="x")
    with pytest.raises(ContainerError, match=r"result: unreadable"):
        unpack(data[: len(data) // 2], "demo-1", what="result")
    with pytest.raises(ContainerError, match=r"Array 'o' has dtype object"):
        pack("demo-1", {}, {"o": np.array([object()], dtype=object)})


def test_a_changed_array_fails_the_checksum():
    import io

    data = pack("demo-1", {}, {"a": np.zeros(4, np.float32)})
    with np.load(io.BytesIO(data)) as npz:
        parts = {k: npz[k] for k in npz.files}
    parts["a"] = np.ones(4, np.float32)
    buf = io.BytesIO()
    np.savez(buf, **parts)
    with pytest.raises(ContainerError, match=r"checksum mismatch"):
        unpack(buf.getvalue(), "demo-1")
