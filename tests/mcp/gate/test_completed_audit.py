"""One builder audits a completed call, whether the gate served it inline or a
background task's leg ran it: the same result gets the same record."""

from __future__ import annotations

import hashlib

from fastmcp.tools.base import ToolResult
from mcp_types import TextContent

from chainweaver.mcp.gate.admission import RunNote
from chainweaver.mcp.gate.requests import UNSENDABLE, Completed, completed


def result(text: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


def test_a_result_is_audited_by_the_digest_and_length_of_its_text() -> None:
    data = '{"total": "é"}'.encode()
    assert completed("tool", result('{"total": "é"}')) == Completed(
        "ok", None, hashlib.sha256(data).hexdigest(), len(data))


def test_a_failed_run_is_an_error_with_the_runs_error_type_never_the_text() -> None:
    audited = completed("tool", result("The flow failed.", is_error=True),
                        RunNote(error_type="KeyError"))
    assert (audited.outcome, audited.error_type) == ("error", "KeyError")
    # Without a note (a result the flow tool did not make) there is no type to give.
    assert completed("tool", result("x", is_error=True)).error_type is None


def test_an_output_sent_as_a_link_is_audited_by_the_outputs_own_digest() -> None:
    note = RunNote(output_sha256="ab" * 32, output_length=12_000_000)
    audited = completed("tool", result("preview", is_error=True), note)
    assert audited == Completed("ok", None, "ab" * 32, 12_000_000)


def test_text_no_transport_can_send_is_an_error_with_no_digest() -> None:
    assert completed("tool", result("lone \ud800")) == Completed("error", UNSENDABLE)
