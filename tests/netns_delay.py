"""A fixed delay for every packet that crosses the test network's switch, where the kernel has no
``netem`` (:mod:`tests.netns_cluster` uses it then). Runs inside the switch's network namespace:

    ip netns exec NS python -m tests.netns_delay QUEUE DELAY_MS STATS_FILE

The switch's ``FORWARD`` chain sends every bridged IPv4 packet to netfilter queue ``QUEUE``
(``iptables -j NFQUEUE``; bridged packets reach that chain through ``br_netfilter``). This process
takes each packet's id as it arrives (metadata only: the packet itself stays in the kernel, whole,
segmentation offload included) and accepts it ``DELAY_MS`` after its arrival, in arrival order, with
one batch verdict for every packet that is due. It speaks netlink through the standard library
(``linux/netfilter/nfnetlink_queue.h``). On SIGTERM it writes ``{"packets", "max_late_ms",
"cpu_s"}`` to STATS_FILE and exits; the kernel then lets packets through undelayed
(``--queue-bypass``) until the rule is removed.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NETLINK_NO_ENOBUFS = 5
SOL_NETLINK = 270
SO_RCVBUFFORCE = 33


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _check_ack(sock: socket.socket, what: str) -> None:
    data = sock.recv(65536)
    length, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, 16)
        if err:
            raise OSError(-err, f"netfilter queue: {what} failed: {os.strerror(-err)}")


def bind_queue(queue: int, maxlen: int = 65536) -> socket.socket:
    """A netlink socket bound to netfilter queue ``queue``, copying metadata only, GSO packets whole."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0)),
                       NLM_F_REQUEST | NLM_F_ACK, 1))
    _check_ack(sock, f"binding queue {queue}")
    params = (_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
              + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
              + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
              + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)))
    sock.send(_message(NFQNL_MSG_CONFIG, queue, params, NLM_F_REQUEST | NLM_F_ACK, 2))
    _check_ack(sock, f"configuring queue {queue}")
    sock.setblocking(False)
    return sock


def packet_ids(data: bytes) -> list[int]:
    """The packet ids of the queue's packet messages in one netlink read."""
    ids = []
    pos = 0
    while pos + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, pos)
        if length < 16:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at, end = pos + 20, pos + length
            while at + 4 <= end:
                alen, atype = struct.unpack_from("=HH", data, at)
                if alen < 4:
                    break
                if atype & 0x3FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                    break
                at += (alen + 3) & ~3
        pos += (length + 3) & ~3
    return ids


def verdict_up_to(sock: socket.socket, queue: int, packet_id: int) -> None:
    """Accepts every queued packet with an id up to ``packet_id``."""
    msg = _message(NFQNL_MSG_VERDICT_BATCH, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)))
    while True:
        try:
            sock.send(msg)
            return
        except BlockingIOError:
            select.select([], [sock], [], 0.01)


def prompt() -> None:
    """Wakes on time: real-time priority (what the ranks compute then waits, as it would for a
    network card) and 1 ns of timer slack instead of 50 us. Best effort."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        pass
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def run(queue: int, delay_s: float, stats_path: str) -> None:
    sock = bind_queue(queue)
    prompt()
    pending: collections.deque = collections.deque()  # (due, id)
    stats = {"packets": 0, "max_late_ms": 0.0}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    buf = bytearray(1 << 20)
    with open(stats_path + ".ready", "w"):
        pass
    while not stop:
        now = time.monotonic()
        wait = max(0.0, pending[0][0] - now) if pending else 0.5
        try:
            ready, _, _ = select.select([sock], [], [], wait)
        except InterruptedError:
            continue
        if ready:
            while True:
                try:
                    n = sock.recv_into(buf)
                except BlockingIOError:
                    break
                due = time.monotonic() + delay_s
                for pid in packet_ids(bytes(buf[:n])):
                    pending.append((due, pid))
        now = time.monotonic()
        last = None
        while pending and pending[0][0] <= now:
            due, last = pending.popleft()
            stats["packets"] += 1
            stats["max_late_ms"] = max(stats["max_late_ms"], (now - due) * 1e3)
        if last is not None:
            verdict_up_to(sock, queue, last)
    if pending:
        verdict_up_to(sock, queue, pending[-1][1])
    times = os.times()
    stats["cpu_s"] = times.user + times.system
    with open(stats_path, "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    run(int(sys.argv[1]), float(sys.argv[2]) / 1e3, sys.argv[3])
