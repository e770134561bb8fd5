"""What a listing shows of the values users give (a schedule's kwargs): a value
under a name like a secret's is hidden, as the status page hides what a
database error quotes (``_status``), and text that is not text (a lone
surrogate) is made safe, so that one stored row cannot fail a listing. The
jobs themselves get the values as given."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["HIDDEN", "is_text", "shown"]


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text that UTF-8 can carry (no lone surrogate)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def shown(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` as a listing shows them (the API, the page, the CLI): a value
    under a name like a secret's (``password``, ``token``, ``api_key``, ``dsn``,
    ``webhook_url``, at any depth), and the credentials of a URL, are `HIDDEN`,
    as a database error's quoted values are on the status page; and a lone
    surrogate that a row got some other way (written by hand, an older release)
    becomes U+FFFD, so that one row cannot fail the listing of every schedule."""
    masked: dict[str, Any] = _masked(kwargs)
    encoded = json.dumps(masked, ensure_ascii=False)
    if is_text(encoded):
        return masked
    # A str holds a character past U+FFFF as one code point: any surrogate is lone.
    fixed: dict[str, Any] = json.loads(_SURROGATE.sub("\ufffd", encoded))
    return fixed


HIDDEN = "[hidden]"
"""What a listing shows in place of a value under a name like a secret's."""

_SECRET = re.compile(
    r"pass(word|wd|phrase)?|pwd|secret|token|api[-_]?key|auth|credential|private[-_]?key"
    r"|cookie|session|dsn|webhook|signature",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")  # the user:password@ of a URL
_SURROGATE = re.compile("[\ud800-\udfff]")


def _masked(value: Any) -> Any:
    """``value`` (JSON) with what its secret-like names hold hidden."""
    if isinstance(value, Mapping):
        return {
            key: HIDDEN if isinstance(key, str) and _SECRET.search(key) else _masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, str) and "@" in value:
        return _USERINFO.sub(HIDDEN + "@", value)  # a URL's credentials, whatever its name
    return value
