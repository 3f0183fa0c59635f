"""Keras's own layer tests through ``TFNet.from_keras`` (issue 51): every ``run_layer_test`` call of the layer tests
that ship in the keras wheel (``keras/src/layers/**/*_test.py``) is replayed, with its inputs (one or several, float
or integer), as a Functional model through tfnet and compared with Keras (tests/tfnet/keras_layer_suite.py):
forward, input gradients, one SGD step, the trainable set. The test prints the count of each verdict and fails on
any call that differs or errs outside the committed list (tests/fixtures/keras_layer_suite_known.txt, each entry
with its reason)."""

import collections
import os

from tests.conftest import lane_cores
from tests.tfnet.keras_layer_suite import run_suite

KNOWN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "keras_layer_suite_known.txt")


def known() -> dict[str, str]:
    with open(KNOWN) as f:
        rows = [line.split(": ", 1) for line in f.read().splitlines() if line.strip() and not line.startswith("#")]
    return {name: reason for name, reason in rows}


def test_keras_layer_tests_pass_through_from_keras(summary_line):
    import keras

    verdicts = run_suite(processes=min(2, lane_cores()))  # fresh processes share the calls, one per core of the lane
    counts = collections.Counter(v.outcome for v in verdicts)
    reasons = collections.Counter(v.reason for v in verdicts if v.outcome == "n/a")
    summary_line(f"keras {keras.__version__} layer tests through from_keras: {len(verdicts)} run_layer_test calls; "
                 + ", ".join(f"{k} {counts[k]}" for k in ("equal", "differs", "error", "n/a"))
                 + "; not applicable: " + ", ".join(f"{r} {n}" for r, n in reasons.most_common()))
    for v in verdicts:
        if v.outcome in ("differs", "error"):
            summary_line(f"  {v.outcome}: {v.name} ({v.layer}): {v.reason}")
    allowed = known()
    unexpected = [f"{v.name} ({v.layer}) {v.outcome}: {v.reason}" for v in verdicts
                  if v.outcome in ("differs", "error") and v.name not in allowed]
    assert not unexpected, "\n".join(unexpected)
    # the tier cannot shrink unseen: Keras 3.15's tests hold 460 calls, 401 of them applicable and equal
    assert len(verdicts) >= 400 and counts["equal"] >= 393, counts
