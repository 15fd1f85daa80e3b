"""Whether redis-py reads a Redis URL as written: a password with an unencoded ``/``, ``?``
or ``#`` would end its host part early, and redis-py's own errors then quote it."""

from __future__ import annotations

import urllib.parse

__all__ = ["redis_url_problem", "sentinel_address_problem", "split_address"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def redis_url_problem(url: str) -> str | None:
    """Why redis-py would not read ``url`` as written, or None when it would.

    redis-py splits a URL with ``urllib.parse``: a ``/``, ``?`` or ``#`` in an unencoded
    password ends the host part there, so the rest of the password becomes the path,
    query or fragment and its start the port (a ValueError that quotes it) or the host (a
    connection error that names it). Since credentials always end with ``@``, an ``@``
    after the host part means that happened. The answer never quotes the URL, and no
    exception raised while parsing is kept (their messages quote it too).
    """
    if not url.startswith(_REDIS_SCHEMES):
        return "it must start with redis://, rediss:// or unix://"
    if not url.isprintable():  # urllib drops tabs and line breaks: a different password
        return "it holds a tab, a line break or another control character"
    if "#" in url:
        return "it holds a '#', which ends the part of a URL that redis-py reads"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    if parts is None:
        return "its host part has unbalanced brackets or characters that are not allowed"
    if "@" in parts.path or "@" in parts.query:
        return (
            "an '@' follows the host part, so a '/' or '?' in the user name or password "
            "ended the host part early"
        )
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        return "its port is not a number from 1 to 65535"
    database = parts.path.replace("/", "")  # as redis-py reads it
    if parts.scheme != "unix" and database and not (database.isascii() and database.isdigit()):
        return "the path after the host must be a database number, such as /0"
    return None


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as (host, port); raises
    ValueError when it is not one."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise ValueError(address)
    number = int(port)
    if not 0 < number < 65536:
        raise ValueError(address)
    return host, number


def sentinel_address_problem(address: str) -> str | None:
    """Why ``address`` is not a Sentinel's ``host:port``, or None."""
    try:
        split_address(address)
    except ValueError:
        return f'sentinel {address!r} is not "host:port" with a port from 1 to 65535'
    return None
