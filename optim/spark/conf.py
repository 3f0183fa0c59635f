"""Spark settings as tfnet reads them, the same way from a classic session and a Spark Connect client.
Pure: runs on both sides.

A classic session's ``spark.conf`` also answers for the SparkContext's settings (Spark copies them into
the session's SQL conf), and a Connect client can only ask ``spark.conf``, so every reader here asks it.
"""

from __future__ import annotations

__all__ = ["setting", "setting_bytes", "size_setting", "pinned_port", "seconds_setting"]

_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "m": 60.0}


def size_setting(text) -> int | None:
    """Bytes of a Spark size setting (``"1g"``, ``"512m"``, ``"4096"``); None for ``"0"`` (unlimited) or
    text that is not a size.

    >>> size_setting("512m")
    536870912
    """
    text = str(text).strip().lower().rstrip("b")
    try:
        value = int(float(text[:-1]) * _UNITS[text[-1]]) if text and text[-1] in _UNITS else int(text)
    except (ValueError, IndexError):
        return None
    return value or None


def setting(spark, key: str, default: str | None = None) -> str | None:
    """``spark.conf.get(key, default)``, or ``default`` when the session cannot answer (a server that
    hides the key, a stopped session). ``spark``: a SparkSession of either kind, or a SparkContext."""
    try:
        if hasattr(spark, "getConf"):  # a SparkContext
            return spark.getConf().get(key, default)
        return spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - py4j or gRPC errors of a session that cannot answer
        return default


def setting_bytes(spark, key: str, default: int) -> int:
    """A size setting in bytes (:func:`size_setting`), or ``default`` when unset, unlimited or unreadable."""
    value = setting(spark, key)
    return (size_setting(value) if value else None) or default


def pinned_port(spark, channel: str) -> int:
    """The port pinned for ``channel`` (``spark.tfnet.rendezvous.port`` / ``spark.tfnet.progress.port``,
    for a firewalled cluster), or 0 for one the OS picks.

    Raises:
        ValueError: the setting is not a port number.
    """
    key = f"spark.tfnet.{channel}.port"
    value = setting(spark, key, "0")
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 <= port < 65536:
        raise ValueError(f"`{key}` must be a port number (0 for any). Received: {value!r}")
    return port


def seconds_setting(spark, key: str, default: float) -> float:
    """Seconds of a Spark time setting (``"2s"``, ``"500ms"``, ``"1min"``; a bare number is seconds, as Spark
    reads ``spark.network.timeout``), or ``default`` when unset or unreadable.

    Raises:
        ValueError: the setting is not a positive time.
    """
    value = setting(spark, key)
    if value is None:
        return default
    text = str(value).strip().lower()
    unit = next((u for u in _TIME_UNITS if text.endswith(u)), "")
    try:
        seconds = float(text[:len(text) - len(unit)]) * _TIME_UNITS.get(unit, 1.0)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"`{key}` must be a positive time (\"2s\", \"500ms\"). Received: {value!r}")
    return seconds
