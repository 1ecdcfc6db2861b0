"""Secrets never reach the store: redaction of configuration and text before it is recorded.

A campaign plan or a run's backend options may carry an API key (``api_key``), a token in a
CLI backend's ``env`` or a password in a base URL. :func:`redact_secrets` replaces every such
value by :data:`REDACTED` (so the record still says that one was given) before a run's
configuration or a plan is written; :func:`redact_url` removes the user information and secret
query parameters of a URL.

A secret can also reach free text: an agent CLI runs with its API key in its environment and
may print it in a tool result, a provider's error may quote the URL it called. So every event,
error, summary, candidate note and verdict passes through :func:`scrub`, which replaces each
*known secret value* (:func:`secret_values`: the values of secret-named backend options and of
credential-named environment variables such as ``OPENAI_API_KEY``) wherever it occurs, and
redacts URLs with credentials inside text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What a secret value is replaced by.
REDACTED = "<redacted>"

#: Parts of an option name (split at ``_``, ``-``, ``.`` and case changes) that mark a secret.
_SECRET_PARTS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "auth", "authorization",
                           "credential", "credentials", "cookie", "bearer", "session"})
_SPLIT = re.compile(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name names a secret: ``api_key``, ``ANTHROPIC_AUTH_TOKEN``,
    ``apiKey``, ``client_secret``, ``password`` ... (``max_tokens`` does not)."""
    parts = {p.lower() for p in _SPLIT.split(str(name)) if p}
    return bool(parts & _SECRET_PARTS)


def redact_url(url: str) -> str:
    """``url`` without user information (``user:password@``) and with the values of
    secret-named query parameters redacted; other text is returned unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="<>")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_secrets(obj):
    """A copy of ``obj`` (JSON-like: dicts, lists, scalars) with the value of every
    secret-named key replaced by :data:`REDACTED` and every URL string passed through
    :func:`redact_url`, at any depth."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_name(k) and v not in (None, "") else redact_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_secrets(v) for v in obj]
    if isinstance(obj, str) and "://" in obj:
        return redact_url(obj)
    return obj


#: Name parts of an environment variable whose value is a credential. Narrower than
#: :func:`is_secret_name`: ``PWD``, ``SSH_AUTH_SOCK`` or ``DBUS_SESSION_BUS_ADDRESS`` hold no secret,
#: and scrubbing their values would blank ordinary paths out of recorded text.
_ENV_SECRET_PARTS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential",
                               "credentials"})
#: The shortest value :func:`scrub` replaces (a shorter one, such as a placeholder key ``fake``,
#: would blank ordinary words).
MIN_SECRET_CHARS = 8
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}`]+")


def is_credential_variable(name: str) -> bool:
    """Whether an environment variable holds a credential: ``OPENAI_API_KEY``,
    ``ANTHROPIC_AUTH_TOKEN``, ``HF_TOKEN``, ``DB_PASSWORD`` (``PWD``, ``SSH_AUTH_SOCK`` do not)."""
    parts = {p.lower() for p in _SPLIT.split(str(name)) if p}
    return bool(parts & _ENV_SECRET_PARTS)


def secret_values(options: Mapping | None = None, environ: Mapping[str, str] | None = None) -> set[str]:
    """The secret strings :func:`scrub` removes: every value (at any depth) of a secret-named key
    of ``options`` (:func:`is_secret_name`), and every value of a credential variable of
    ``environ`` (:func:`is_credential_variable`); values shorter than :data:`MIN_SECRET_CHARS`
    are left out."""
    out: set[str] = set()

    def walk(obj, secret: bool) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, secret or is_secret_name(k))
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, secret)
        elif secret and isinstance(obj, str):
            out.add(obj)

    walk(options or {}, False)
    for name, value in (environ or {}).items():
        if is_credential_variable(name) and isinstance(value, str):
            out.add(value)
    return {v for v in out if len(v) >= MIN_SECRET_CHARS}


def _url_with_secret(match: re.Match) -> str:
    url = match.group(0)
    try:
        parts = urlsplit(url)
        secret = "@" in parts.netloc or any(is_secret_name(k) for k, _ in parse_qsl(parts.query))
    except ValueError:
        return url
    return redact_url(url) if secret else url


def scrub(obj, values: Iterable[str]):
    """A copy of ``obj`` (JSON-like) where every string has each of ``values`` (secrets, see
    :func:`secret_values`) replaced by :data:`REDACTED`, and every URL inside it that carries
    user information or a secret-named query parameter redacted (:func:`redact_url`); other
    text is unchanged. Keys are kept."""
    secrets = sorted({v for v in values if v and len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    def clean(text: str) -> str:
        for s in secrets:
            if s in text:
                text = text.replace(s, REDACTED)
        return _URL_IN_TEXT.sub(_url_with_secret, text) if "://" in text else text

    def walk(o):
        if isinstance(o, str):
            return clean(o)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        return o

    return walk(obj)
