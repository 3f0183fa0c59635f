"""Keys and request signatures for tfnet's channels between the driver and the ranks. Pure: runs
on both sides.

Every ``optimize()`` call makes one random job secret on the driver. It never leaves the driver:
each channel gets its own key derived from it (HMAC-SHA256 of the purpose, as HKDF's expand step
does), so a key seen on one channel opens no other. The rendezvous store's requests carry an
HMAC of the method, the path and the body (header ``X-Tfnet-Auth``), never a key itself.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["AUTH_HEADER", "PURPOSES", "derive_key", "sign_request", "verify_request"]

AUTH_HEADER = "X-Tfnet-Auth"
#: The channels: the rendezvous store (step counts, failure reports, heartbeats, Gloo's own keys)
#: and the progress channel (rank 0 to the driver).
PURPOSES = ("rendezvous", "progress")


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The key for ``purpose`` (one of :data:`PURPOSES`), derived from the job's secret.

    >>> derive_key(b"s" * 32, "rendezvous") != derive_key(b"s" * 32, "progress")
    True
    """
    if purpose not in PURPOSES:
        raise ValueError(f"Unknown key purpose {purpose!r}; expected one of {PURPOSES}.")
    if len(secret) < 16:
        raise ValueError(f"The job secret must be at least 16 bytes. Received: {len(secret)} bytes")
    return hmac.new(secret, b"tfnet-channel-key/" + purpose.encode(), hashlib.sha256).digest()


def sign_request(key: bytes, method: str, path: str, body: bytes | None) -> str:
    """The ``X-Tfnet-Auth`` value for one request: hex HMAC-SHA256 over method, path and body."""
    mac = hmac.new(key, f"{method.upper()} {path}\n".encode(), hashlib.sha256)
    mac.update(body or b"")
    return mac.hexdigest()


def verify_request(key: bytes, header: str | None, method: str, path: str, body: bytes | None) -> bool:
    """True when ``header`` is the signature of this request under ``key`` (constant time)."""
    if not header:
        return False
    return hmac.compare_digest(header.encode(), sign_request(key, method, path, body).encode())
