"""Keep credentials out of logs, XCom and exception messages.

Airflow masks a connection's password in task logs, but not in XCom, not in an alert
sent to a webhook, and not in the output of `dag.test()`. So every value that leaves
this package through one of those doors passes `redact`, and every call that might
fail with a message quoting a credential (a client error echoing a request) runs in
`secrets_hidden`, which re-raises such an error with the secret replaced.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

from streamkeeper_airflow.errors import SecretSafeError

MASK = "***"
# As Airflow's masker ([logging] min_length_masked_secret): masking a shorter value would
# garble every message, and no real credential is that short.
MIN_SECRET_LENGTH = 5
# user:password@ in a URL, and key=value / "key": "value" pairs whose key names a secret.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@:]+:[^/\s@]+@")
# The key must end with the word: `auth_token`, `fs.s3a.secret.key` name secrets;
# `tokenizer`, `max_tokens` or `secret_rotation_days` do not.
_SECRET_PAIR = re.compile(
    r"(?i)(?P<key>\b[\w.-]*(?:password|passwd|secret|token|credentials?|"
    r"(?:api|access|secret|private)[._-]?key))"
    r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\s\"';,}]+)"
)
_SAFE_TOKEN_KEYS = ("run_token", "run-token")  # ids, not credentials


def secret_pairs(text: str) -> list[str]:
    """The keys of `text`'s key=value (or "key": "value") pairs that name a secret."""
    return [
        m.group("key")
        for m in _SECRET_PAIR.finditer(text)
        if not m.group("key").lower().endswith(_SAFE_TOKEN_KEYS)
    ]


def _maskable(secrets: Iterable[str | None]) -> list[str]:
    return sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every given secret, URL credentials and secret-named pairs masked."""
    for secret in _maskable(secrets):
        text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(rf"\g<scheme>{MASK}@", text)

    def pair(match: re.Match[str]) -> str:
        if match.group("key").lower().endswith(_SAFE_TOKEN_KEYS):
            return match.group(0)
        return f"{match.group('key')}{match.group('sep')}{MASK}"

    return _SECRET_PAIR.sub(pair, text)


def redact_value(value: Any, secrets: Iterable[str | None] = ()) -> Any:
    """A JSON-like value with `redact` applied to every string in it."""
    secrets = list(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v, secrets) for v in value]
    return value


def _texts(error: BaseException) -> Iterator[str]:
    """The messages of an error and of everything it was raised from."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        yield repr(current)
        current = current.__cause__ or current.__context__


def holds_secret(error: BaseException, secrets: Iterable[str | None]) -> bool:
    wanted = _maskable(secrets)
    return any(s in text for text in _texts(error) for s in wanted)


@contextlib.contextmanager
def secrets_hidden(secrets: Iterable[str | None]) -> Iterator[None]:
    """Re-raise an error that quotes a secret (here or in its chain) with it redacted.

    The replacement is raised `from None`: a traceback must not print the original.
    """
    secrets = _maskable(secrets)
    try:
        yield
    except Exception as error:
        if not holds_secret(error, secrets):
            raise
        message = redact(f"{type(error).__name__}: {error}", secrets)
        raise SecretSafeError(message) from None


def register_with_airflow(secrets: Iterable[str | None]) -> None:
    """Ask Airflow to mask these values in task logs too (a no-op outside Airflow)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - used without Airflow
        return
    for secret in secrets:
        if secret:
            mask_secret(secret)
