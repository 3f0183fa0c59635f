"""A ``model_dir`` that fills up during a distributed run (issue 42's fault matrix): a real full disk (a tmpfs sized
for two checkpoints) under two ranks of a local[2] Spark. The run stops at the checkpoint that does not fit with a
typed error that names the folder and the bytes it needed, takes no retry (a rerun would fail the same way), leaves
the earlier checkpoints whole and no temporary file, and its last good checkpoint resumes elsewhere and finishes."""

import glob
import os
import subprocess
import warnings

import pytest

import optim
from optim import TFOptimizer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.elastic_checks import checkpoint_digest
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture
def mount(tmp_path):
    """``mount(size_bytes)``: a tmpfs of that size (a real disk that fills), unmounted after; skipped where this
    process may not mount one (it needs root, as CI has)."""
    mounted = []

    def make(size: int):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_model_dir_stops_the_run_with_a_typed_error_and_its_last_checkpoint_resumes(spark, tmp_path, mount):
    x, y = digits.load()
    x, y = x[:384], y[:384]  # 12 steps an epoch

    def opt_for(model_dir):
        return TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05, momentum=0.9),
                           model_dir=str(model_dir))

    # how large a checkpoint is, from one local step; the disk holds two and a margin for the small files
    probe = opt_for(tmp_path / "probe")
    probe.optimize((x, y), epochs=1, batch_size=32, max_steps=4, checkpoint_every=4, verbose=0)
    size = os.path.getsize(glob.glob(str(tmp_path / "probe" / "checkpoints" / "*" / "ckpt-*.npz"))[0])
    disk = mount(((2 * size + (96 << 10)) // 4096 + 1) * 4096)

    opt = opt_for(disk)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(optim.StorageError) as info:
        warnings.simplefilter("always")
        opt.optimize((x, y), epochs=3, batch_size=32, num_workers=2, checkpoint_every=4, keep_checkpoints=10,
                     verbose=0, timeout=60, max_retries=2)
    folder = glob.glob(str(disk / "checkpoints" / "*"))[0]
    message = str(info.value)
    assert f"{folder} is full (No space left on device); the checkpoint needs " in message, message
    needed = int(message.split("the checkpoint needs ")[1].split(" bytes")[0].replace(",", ""))
    assert needed >= size and "Free space, or give model_dir another place" in message, message
    kept = sorted(glob.glob(os.path.join(folder, "ckpt-*.npz")))
    assert [os.path.basename(p) for p in kept] == ["ckpt-000000004.npz", "ckpt-000000008.npz"], kept
    assert f"the newest that stays is {kept[-1]}" in message, message
    # no retry: one attempt (its ranks' tallies only), no warning that it retried, no temporary file left
    assert not [w for w in caught if "retrying" in str(w.message)], [str(w.message) for w in caught]
    assert {os.path.basename(p)[:10] for p in glob.glob(str(disk / "ranks" / "*" / "epochs-*.json"))} == {"epochs-a0-"}
    assert not [n for n in os.listdir(folder) if not n.startswith("ckpt-")], os.listdir(folder)
    for path in kept:
        CheckpointManager.load(path)
    # the last good checkpoint resumes, on a disk with room, and the run finishes its planned steps
    again = opt_for(tmp_path / "room")
    again.optimize((x, y), epochs=3, batch_size=32, num_workers=2, checkpoint_every=4, verbose=0, resume=kept[-1])
    run = again.last_run
    assert again.global_step == 36 and run["start_step"] == 8 and run["attempts"] == 1
    assert run["attempt_log"][0]["start_sha256"] == checkpoint_digest(kept[-1])
