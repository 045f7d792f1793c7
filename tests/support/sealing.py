"""What a sealed user-data section must look like, derived independently of the library:
XML's own escaping, and tag-bracket look-alikes found by their Unicode names."""

from __future__ import annotations

import functools
import html
import re
import unicodedata

# Characters XML 1.0 cannot carry, not even as references.
NOT_XML_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
# What makes a character a tag-bracket look-alike, by its Unicode name.
LOOKALIKE_NAME = re.compile(
    r"ANGLE BRACKET|ANGLE QUOTATION MARK|^(?:FULLWIDTH |SMALL )?(?:LESS|GREATER)-THAN SIGN$"
    r"|(?:LEFT|RIGHT) ARROWHEAD$|^(?:PRECEDES|SUCCEEDS)$|^(?:LESS|GREATER)-THAN WITH DOT$"
    r"|^CANADIAN SYLLABICS P[AO]$|NORMAL SUBGROUP OF$|CONTAINS AS NORMAL SUBGROUP$"
    r"|DOTTED RIGHT-POINTING ANGLE$")


@functools.lru_cache(maxsize=1)
def lookalike_brackets() -> frozenset[str]:
    """< and > and every character named like them, plus the invisible Tags block."""
    named = {chr(code) for code in range(0x110000)
             if LOOKALIKE_NAME.search(unicodedata.name(chr(code), ""))}
    return frozenset(named | {chr(code) for code in range(0xE0000, 0xE0080)})


def sealed(value: str) -> str:
    """How a value is written inside a user-data section: XML-escaped, carriage returns
    and look-alike brackets as character references."""
    escaped = html.escape(value, quote=False).replace("\r", "&#xd;")
    return "".join(f"&#x{ord(c):x};" if c in lookalike_brackets() and c not in "<>" else c
                   for c in escaped)
