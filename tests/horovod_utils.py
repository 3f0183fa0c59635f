"""Two real Horovod ranks as plain processes (no Spark), meeting through tfnet's secured
rendezvous store: each runs ``script`` with ``rank port key_hex *args``."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_rank_pair(script: str, tmp_path, args=(), env: dict | None = None,
                  timeout_s: float = 240) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of each rank, in rank order; both are killed if one runs
    past ``timeout_s``. ``env`` is added to this process's environment (with the repository on
    ``PYTHONPATH``)."""
    from optim.transport.store import SecureRendezvous

    path = tmp_path / "rank.py"
    path.write_text(script)
    full_env = dict(os.environ, **(env or {}),
                    PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    key = os.urandom(32)
    with SecureRendezvous("127.0.0.1", 2, key) as rendezvous:
        procs = [subprocess.Popen([sys.executable, str(path), str(r), str(rendezvous.address[1]), key.hex(), *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
                 for r in range(2)]
        outs = []
        for p in procs:
            try:
                stdout, stderr = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            outs.append((p.returncode, stdout, stderr))
    return outs


def result_of(stdout: str):
    """The JSON a rank printed on its ``RESULT `` line."""
    return json.loads(next(line[7:] for line in stdout.splitlines() if line.startswith("RESULT ")))
