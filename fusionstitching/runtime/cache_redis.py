"""The remote tier of the kernel cache: entries on a Redis server shared by a job's hosts.

An entry is the same bytes as in a cache directory, stored under ``fusionstitching:<key>``
behind an HMAC-SHA256 of key and bytes. The HMAC's secret comes from the job's environment
(``FUSIONSTITCHING_CACHE_SECRET``): a process that can write to the server but does not hold
it cannot plant object code the job runs. Without a secret the remote tier is not used.
Eviction is the server's (``maxmemory-policy allkeys-lru``).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
import urllib.parse

SECRET_VARIABLE = "FUSIONSTITCHING_CACHE_SECRET"
PREFIX = b"fusionstitching:"
TIMEOUT_S = 5.0  # a connect or a command: an unreachable server costs this once per process
_TAG_BYTES = hashlib.sha256().digest_size


class Unavailable(Exception):
    """The server cannot be used: ``kind`` is "unreachable" (connect, timeout, refused
    credentials), "no-secret" (nothing to sign with), or "remote-failed" (an error reply)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class BadSignature(ValueError):
    """An entry on the server not signed with this job's secret (planted, or another job's)."""


def redacted(url: str) -> str:
    """``url`` without its password: what reports and warnings print."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    netloc = f"{user}***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


_clients: dict = {}
_clients_lock = threading.Lock()


class RedisTier:
    """Signed entries on the server at ``url`` (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str, secret: str | None = None):
        self.url = url
        secret = os.environ.get(SECRET_VARIABLE) if secret is None else secret
        if not secret:
            raise Unavailable("no-secret", f"{SECRET_VARIABLE} is not set: entries on a "
                              "shared server are loaded only when signed with the job's secret")
        self._secret = secret.encode()
        self._redis = _redis_module()
        self._client = _client(self._redis, url)

    def get(self, key: str) -> bytes | None:
        """The entry's bytes, None when absent; raises BadSignature or Unavailable."""
        value = self._call("GET", self._client.get, PREFIX + key.encode())
        if value is None:
            return None
        tag, data = value[:_TAG_BYTES], value[_TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(key, data)):
            raise BadSignature("remote entry not signed with this job's secret")
        return data

    def put(self, key: str, data: bytes) -> None:
        self._call("SET", self._client.set, PREFIX + key.encode(), self._tag(key, data) + data)

    def _tag(self, key: str, data: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + data, hashlib.sha256).digest()

    def _call(self, command: str, method, *args):
        errors = self._redis
        try:
            return method(*args)
        except (errors.ConnectionError, errors.TimeoutError, errors.AuthenticationError) as exc:
            raise Unavailable("unreachable", f"{type(exc).__name__}: {exc}"
                              ) from None
        except errors.RedisError as exc:  # e.g. OOM with maxmemory-policy noeviction
            raise Unavailable("remote-failed", f"{command}: {exc}") from None


def _redis_module():
    try:
        import redis  # the optional `cluster` extra
    except ImportError:
        raise Unavailable("unreachable", "the redis client is not installed (pip install "
                          "'fusionstitching[cluster]')") from None
    return redis


def _client(redis, url: str):
    """One client (and its connection pool) per URL and process."""
    with _clients_lock:
        if url not in _clients:
            try:
                _clients[url] = redis.Redis.from_url(
                    url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
            except ValueError as exc:  # not a redis:// URL
                raise Unavailable("unreachable", str(exc)) from None
        return _clients[url]
