"""Version strings compared as versions: semver (``1.2.0-rc.1``) and PEP 440 (``1.2rc1``).

Both schemes map to one sort key, so ``1.10.0 > 1.9.0``, ``1.0.0-alpha < 1.0.0`` and
``1.0a1 == 1.0.0-alpha.1`` hold whichever spelling an author picks. A version is at
most :data:`MAX_VERSION_LENGTH` characters (as node-semver holds it), so its numbers are
always small enough to compare.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .errors import InvalidVersionError

MAX_VERSION_LENGTH = 256

_SEMVER = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_PEP440 = re.compile(
    r"^v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_implicit>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>\d*))?"
    r"(?:[-_.]?(?P<dev>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?$",
    re.IGNORECASE,
)
# PEP 440 pre-release letters spelled as the semver identifiers they sort like.
_PRE_WORDS = {"a": "alpha", "alpha": "alpha", "b": "beta", "beta": "beta",
              "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}

VersionKey = tuple


def _shown(text: str, width: int = 40) -> str:
    return repr(text if len(text) <= width else f"{text[:width - 3]}...")


def _identifier(part: str) -> tuple[int, int, str]:
    # semver: numeric identifiers sort before alphanumeric ones.
    return (0, int(part), "") if part.isdigit() else (1, 0, part)


def _strip_zeros(release: list[int]) -> tuple[int, ...]:
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


@lru_cache(maxsize=4096)
def version_key(version: str) -> VersionKey:
    """Sort key for a version string; :class:`InvalidVersionError` if it is neither scheme."""
    if not isinstance(version, str) or not version.strip():
        raise InvalidVersionError(f"version must be a non-empty string, got {version!r}")
    if len(version) > MAX_VERSION_LENGTH:
        # Checked before any number is read: Python refuses to convert more than 4300
        # digits (ValueError), and a key holding such numbers is no use to anyone.
        raise InvalidVersionError(f"version {_shown(version)} is {len(version)} characters "
                                  f"long; at most {MAX_VERSION_LENGTH} are allowed")
    text = version.strip()
    semver = _SEMVER.match(text)
    if semver:
        major, minor, patch, pre, build = semver.groups()
        release = _strip_zeros([int(major), int(minor), int(patch)])
        semver_pre = (0, tuple(_identifier(p) for p in pre.split("."))) if pre else (1, ())
        return (0, release, semver_pre, (-1,), (1, 0), build or "")
    pep = _PEP440.match(text)
    if not pep:
        raise InvalidVersionError(
            f"version {version!r} is neither a PEP 440 nor a semver version "
            "(examples: '1.0.0', '2.1', '1.0.0-rc.1', '1.0rc1')"
        )
    epoch = int(pep["epoch"] or 0)
    release = _strip_zeros([int(p) for p in pep["release"].split(".")])
    post = pep["post_implicit"] or pep["post_n"]
    has_post = pep["post_implicit"] is not None or pep["post_n"] is not None
    if pep["pre"]:
        word = _PRE_WORDS[pep["pre"].lower()]
        pre_key: tuple = (0, ((1, 0, word), (0, int(pep["pre_n"] or 0), "")))
    elif pep["dev"] and not has_post:
        pre_key = (-1, ())  # 1.0.dev1 sorts before 1.0a1
    else:
        pre_key = (1, ())
    post_key = (int(post or 0),) if has_post else (-1,)
    dev_key = (0, int(pep["dev_n"] or 0)) if pep["dev"] else (1, 0)
    return (epoch, release, pre_key, post_key, dev_key, (pep["local"] or "").lower())


def is_valid_version(version: str) -> bool:
    try:
        version_key(version)
    except InvalidVersionError:
        return False
    return True
