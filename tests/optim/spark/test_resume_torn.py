"""``optimize(resume=True)`` over two Horovod ranks (a real local[2] Spark) past a truncated newest checkpoint: rank 0
passes over it to the one before, the driver says why once (a CheckpointWarning naming the file), and the run
starts from what that older checkpoint holds, bit for bit (rank 0's digest of its start against the file's)."""

import pytest

import optim
from optim import TFOptimizer
from tests.elastic_checks import checkpoint_digest
from tests.optim.test_optimizer import SCE, data, small_net, torn_run

pytestmark = [pytest.mark.spark, pytest.mark.parallel]


def test_resume_on_two_ranks_passes_over_a_truncated_newest_checkpoint(spark, tmp_path):
    older, truncated = torn_run(str(tmp_path))  # a local run's checkpoints at steps 4 and 8, the newest cut
    x, y = data(128)
    again = TFOptimizer(small_net(seed=7), SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path))
    with pytest.warns(optim.CheckpointWarning) as warned:
        again.optimize((x, y), epochs=3, batch_size=32, num_workers=2, resume=True, verbose=0, timeout=60)
    said = [str(w.message) for w in warned if issubclass(w.category, optim.CheckpointWarning)]
    assert len(said) == 1 and f"Skipping checkpoint {truncated}: unreadable" in said[0], said
    run = again.last_run
    assert run["attempts"] == 1 and run["resumed_from"] == older, run
    start = run["attempt_log"][-1]
    assert start["start_step"] == 4 and start["start_sha256"] == checkpoint_digest(older), start
    assert again.global_step == 12
