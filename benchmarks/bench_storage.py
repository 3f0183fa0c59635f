"""Checkpoints to a local folder against an S3 server: write (atomic: temporary key, then move) and
read back (with the SHA-256 check), side by side in one run.

The S3 server is moto in server mode on loopback (started here, port chosen by the OS): it measures
tfnet's own cost (serialising, the extra copy of the atomic move, fsspec and botocore), not a
network. The checkpoint holds ResNet-50's weights and an SGD-with-momentum state (2 x 25.6M float32).

    python benchmarks/bench_storage.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import banner, finish, interleaved, median  # noqa: E402


def start_moto() -> tuple[subprocess.Popen, str, str]:
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", "0"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        m = re.search(r"Running on (http://127\.0\.0\.1:\d+)", open(log.name, errors="replace").read())
        if m:
            return proc, m.group(1), log.name
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(open(log.name).read())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import numpy as np

    from optim.training.checkpoint import Checkpoint, CheckpointManager

    proc, endpoint, _ = start_moto()
    try:
        import boto3

        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        rng = np.random.default_rng(0)
        weights = {f"w{i}": rng.standard_normal(n, dtype=np.float32) for i, n in enumerate([25_557_032 // 4] * 4)}
        state = [rng.standard_normal(v.size, dtype=np.float32) for v in weights.values()]
        ckpt = Checkpoint(1, 0, 0, weights, state)
        mb = (sum(v.nbytes for v in weights.values()) + sum(s.nbytes for s in state)) / 2**20
        local = CheckpointManager(tempfile.mkdtemp(prefix="bench-ckpt-"), keep=1, run_id="20260101-000000-000000-0000")
        remote = CheckpointManager("s3://bench/checkpoints", keep=1, run_id="20260101-000000-000000-0000",
                                   storage_options=options)
        times = interleaved({
            "local write": lambda: local.save(ckpt),
            "s3 write": lambda: remote.save(ckpt),
            "local read": lambda: CheckpointManager.load(local.path_for(1)),
            "s3 read": lambda: CheckpointManager.load(remote.path_for(1), options),
        }, rounds=args.rounds)
    finally:
        proc.terminate()
    print(banner())
    print(f"# checkpoint of {mb:.0f} MiB, {args.rounds} rounds, median seconds; S3 = moto on loopback")
    out = {k: median(v) for k, v in times.items()}
    for k, v in out.items():
        print(f"{k:12s} {v:7.3f} s  {mb / v:7.0f} MiB/s")
    print(f"s3 / local: write {out['s3 write'] / out['local write']:.2f}x, read {out['s3 read'] / out['local read']:.2f}x")
    finish(args.json, {"mib": mb, "median_s": out})


if __name__ == "__main__":
    main()
