"""The row tally's stitching (tests/elastic_checks.py), on tally records written by hand: an attempt that resumed from
a checkpoint taken after an epoch's last batch (the loop then opens that epoch at its end and trains none of it) is not
credited with that epoch; an epoch resumed mid-way is, with the rows before its checkpoint from the attempt before."""

from tests.elastic_checks import stitched_epochs

STEPS = 4


def _epoch(from_batch: int, batches: int, first_row: int) -> dict:
    rows = list(range(first_row + from_batch, first_row + from_batch + batches))
    return {"from_batch": from_batch, "batches": batches, "rows": len(rows), "fingerprint": sum(rows)}


def _rank(attempt: int, size: int, epochs: dict, checkpoints: dict | None = None) -> dict:
    return {"attempt": attempt, "size": size, "epochs": {str(e): r for e, r in epochs.items()},
            "checkpoints": checkpoints or {}}


def test_an_attempt_resumed_at_an_epochs_end_is_not_credited_with_that_epoch():
    # attempt 0 trains epochs 0 and 1 (one rank, 4 batches each) and checkpoints after epoch 1's last batch; attempt 1
    # resumes there: it opens epoch 1 at batch 4 (nothing left) and trains epoch 2
    first = _rank(0, 1, {0: _epoch(0, 4, 0), 1: _epoch(0, 4, 100)},
                  {"8": {"epoch": 1, "batch": 4, "from_batch": 0, "rows": 4, "fingerprint": sum(range(100, 104))}})
    second = _rank(1, 1, {1: _epoch(4, 0, 100), 2: _epoch(0, 4, 200)})
    got = stitched_epochs([first, second], STEPS)
    assert sorted(got) == [(0, 0), (0, 1), (1, 2)]
    assert got[(0, 1)] == (4, sum(range(100, 104)))


def test_an_epoch_resumed_mid_way_is_stitched_to_the_rows_before_its_checkpoint():
    first = _rank(0, 1, {0: _epoch(0, 3, 0)},
                  {"2": {"epoch": 0, "batch": 2, "from_batch": 0, "rows": 2, "fingerprint": 0 + 1}})
    second = _rank(1, 1, {0: _epoch(2, 2, 0)})
    got = stitched_epochs([first, second], STEPS)
    assert got == {(1, 0): (4, sum(range(4)))}
