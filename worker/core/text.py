"""Text from outside (a reason, a request's field) made safe to put in a header, a log
line or a terminal: the one sanitiser every encoder shares."""

from __future__ import annotations

__all__ = ["MAX_REASON_LENGTH", "safe_text"]

MAX_REASON_LENGTH = 512


def safe_text(text: str, limit: int = MAX_REASON_LENGTH) -> str:
    """Printable ASCII only, cut to ``limit``: safe for headers, logs and terminals."""
    cleaned = text.encode("ascii", "backslashreplace").decode("ascii")
    cleaned = "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in cleaned)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."
