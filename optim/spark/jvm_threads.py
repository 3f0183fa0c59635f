"""tfnet's own threads and the JVM: nothing in the user's log from them. Driver side.

py4j gives every Python thread that calls the JVM a connection of its own, and when the thread ends and the connection
is collected, py4j logs ``INFO:py4j.clientserver:Closing down clientserver connection``: under the user's
``logging.basicConfig(level=INFO)`` one line for each of tfnet's threads (a Spark job each, the warm-up), six in a
three-epoch run. A plain PySpark job prints it once, for its main thread at exit. :func:`release_connection`, called
by a tfnet thread as it ends, closes that thread's connection with py4j's line muted for this thread alone, so the
connection's later collection closes nothing and logs nothing. Other threads' lines and the user's logging stay as
they are.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["release_connection"]

_PY4J_LOG = "py4j.clientserver"


class _ThisThread(logging.Filter):
    def __init__(self):
        super().__init__()
        self.ident = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.ident


def release_connection() -> None:
    """Closes the calling thread's py4j connection, if it has one, without py4j's INFO line. Safe anywhere: without
    pyspark, a gateway or a connection it does nothing."""
    try:
        from pyspark import SparkContext
    except ImportError:  # pragma: no cover - tfnet's threads run where pyspark is
        return
    client = getattr(getattr(SparkContext, "_gateway", None), "_gateway_client", None)
    get = getattr(client, "get_thread_connection", None)
    connection = get() if get is not None else None
    if connection is None:
        return
    logger, muted = logging.getLogger(_PY4J_LOG), _ThisThread()
    logger.addFilter(muted)
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - a connection the gateway's shutdown closed already
        pass
    finally:
        logger.removeFilter(muted)
    connection.close = lambda *args, **kwargs: None  # its collection later: no second close, no line
    try:
        client.deque.remove(connection)
    except (ValueError, AttributeError):
        pass
    client.thread_connection.connection = None
