"""The compose cluster's health checks (docker/docker-compose.yml), one per role:

    python -I -S /usr/local/share/tfnet/health.py master     the master's web UI answers (its /json/)
    python -I -S /usr/local/share/tfnet/health.py worker     the master lists this container's worker as ALIVE
    python -I -S /usr/local/share/tfnet/health.py connect    the Connect server listens and has an executor on every
                                                             ALIVE worker (a barrier stage over all of them can start)

Exit 0 when healthy; else 1, with the reason in one line (``docker inspect``'s Health log keeps it).

Docker runs a check every ``interval`` for the container's whole life, and each costs a ``runc exec`` and a Python:
about 0.1 CPU-seconds on a 2-core AMD EPYC Zen 4, so an idle master and 2 workers checked every 2 s took 9.4 of
their 12.4 CPU-seconds a minute (docs/benchmarks.md, 2026-12-03). The engine these machines have (Debian's 20.10)
has no ``start_interval`` (Engine 25), so a short ``interval`` for a quick start would be the steady rate too. So a
check that finds the container healthy in the same run as its last check (a marker in /tmp, named by PID 1's start
time, so a restarted container checks at once) first sleeps ``TFNET_HEALTH_STEADY_S`` (20 s; the compose file's
``timeout`` leaves room for it): a quick start, then about one check every 22 s while healthy. A failed check
removes the marker, so a container that stops being healthy is checked every ``interval`` again.

Standard library only (``-I -S``: no site-packages, no user site), HTTP by a plain socket: 23 ms against 55 ms for
the same Python with ``urllib.request`` imported.
"""

import json
import os
import socket
import sys
import time

MASTER_UI = ("spark-master", 8080)
CONNECT_PORT = 15002
DRIVER_UI_PORT = 4040
TIMEOUT_S = 3.0
STEADY_S = float(os.environ.get("TFNET_HEALTH_STEADY_S", "20"))
MARKER = "/tmp/tfnet-healthy"


class Unhealthy(Exception):
    pass


def get_json(host: str, port: int, path: str):
    """``GET path`` over HTTP/1.0 (the server closes the connection after the body), the body parsed as JSON."""
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: application/json\r\n\r\n".encode())
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        raise Unhealthy(f"http://{host}:{port}{path}: {exc}") from None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise Unhealthy(f"http://{host}:{port}{path}: {head[:80].decode(errors='replace')!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise Unhealthy(f"http://{host}:{port}{path}: not JSON: {body[:80]!r}") from None


def alive_workers(master: dict) -> list[dict]:
    return [w for w in master.get("workers", []) if w.get("state") == "ALIVE"]


def check_master() -> None:
    get_json(*MASTER_UI, "/json/")


def check_worker() -> None:
    me = socket.gethostbyname(socket.gethostname())
    if not any(w.get("host") == me for w in alive_workers(get_json(*MASTER_UI, "/json/"))):
        raise Unhealthy(f"the master lists no ALIVE worker at {me}")


def check_connect() -> None:
    try:
        socket.create_connection(("127.0.0.1", CONNECT_PORT), timeout=TIMEOUT_S).close()
    except OSError as exc:
        raise Unhealthy(f"nothing listens on {CONNECT_PORT}: {exc}") from None
    me = socket.gethostname()
    apps = get_json(me, DRIVER_UI_PORT, "/api/v1/applications")
    if not apps:
        raise Unhealthy("the Connect server's driver lists no application yet")
    executors = sum(e.get("id") != "driver" for e in get_json(me, DRIVER_UI_PORT,
                                                               f"/api/v1/applications/{apps[0]['id']}/executors"))
    alive = len(alive_workers(get_json(*MASTER_UI, "/json/")))
    if executors < alive:
        raise Unhealthy(f"{executors} executor(s) for {alive} ALIVE worker(s)")


CHECKS = {"master": check_master, "worker": check_worker, "connect": check_connect}


def this_run() -> str:
    """PID 1's start time (clock ticks since boot): the same for every check of one run of the container."""
    try:
        with open("/proc/1/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def healthy_before(run: str) -> bool:
    try:
        with open(MARKER) as f:
            return bool(run) and f.read() == run
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: health.py {{{'|'.join(CHECKS)}}}", file=sys.stderr)
        return 2
    run = this_run()
    if healthy_before(run):
        time.sleep(STEADY_S)
    try:
        CHECKS[argv[0]]()
    except Unhealthy as exc:
        try:
            os.remove(MARKER)
        except OSError:
            pass
        print(f"unhealthy: {exc}")
        return 1
    try:
        with open(MARKER, "w") as f:
            f.write(run)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
