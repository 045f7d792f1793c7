"""Every command and log line masks a store URL's password the same way, whether it is
in the user part or in the query (``chainweaver worker`` once showed ``?password=``)."""

from __future__ import annotations

import pytest

from chainweaver.cli.errors import redacted
from chainweaver.governance.state import masked_url


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://:secret@host/0", "redis://:***@host/0"),
    ("redis://host/0?password=secret&db=1", "redis://host/0?password=***&db=1"),
    ("rediss://u:a:b@host/0?PASSWORD=x", "rediss://u:***@host/0?password=***"),
    ("redis://host:6379/0", "redis://host:6379/0"),
])
def test_the_password_is_masked_wherever_the_url_holds_it(url: str, shown: str) -> None:
    assert redacted(url) == masked_url(url) == shown


def test_no_url_reads_as_no_queue() -> None:
    assert redacted(None) == redacted("") == "no queue"
