"""The engine docs stay true: every ```python block in them runs.

Blocks of one page share a namespace and run in order, like a reader pasting them in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["tools.md", "flows.md", "registry.md", "executor.md"]

# Lines each page prints (a comment after print(...) shows the reader the same thing).
EXPECTED_OUTPUT = {
    "tools.md": ["['sku']", "'side_effects': 'write'", "False {'text': 'HI'}"],
    "flows.md": [
        "{'converted': 22.0}",
        "cannot move a flow from 'active' to 'draft' (allowed: archived)",
        'Explain today\'s rate for <user-data name="currency">EUR</user-data>.',
    ],
    "registry.md": [
        "['1.0', '1.9.0', '1.10.0']",
        "flow 'order_lookup' version '1.0.0' is already registered",
        "has no version '2.0.0' (registered: 1.0, 1.9.0, 1.10.0)",
    ],
    "executor.md": [
        "True {'sku': 'SKU-1', 'message': 'SKU-1: in stock'}",
        "0 check_stock {'sku': 'SKU-1'} -> {'sku': 'SKU-1', 'available': 3}",
        "1 reply {'sku': 'SKU-1', 'available': 3} -> {'message': 'SKU-1: in stock'}",
        "False KeyError 0 check_stock",
        "StepInputError 1 add_tax total_cents",
        "MissingContextKeyError total_cents",
        "{'converted': 11.0}",
        "TimeoutError wait_forever 3",
        "ApprovalRequired []",
        "  read_profile (read): reads personal data",
        "  delete_account (write): deletes the account",
        "ApprovalDenied []",
        "True ['read_profile', 'summarize', 'delete_account']",
        "approve step 'pay' (tool 'pay', write: pays out)?",
        "external True sends e-mail",
        "step 0 uses unregistered tool 'load_usr'",
        "{'charged': 500} [True, False]",
        "{'text': 'hi!'}",
    ],
}


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)


@pytest.mark.parametrize("page", PAGES)
def test_python_examples_run(page: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python examples"
    namespace: dict = {"__name__": f"docs_{page[:-3]}"}
    for code in blocks:
        exec(compile(code, str(DOCS / page), "exec", dont_inherit=True), namespace)
    output = capsys.readouterr().out
    for expected in EXPECTED_OUTPUT[page]:
        assert expected in output


def test_printed_comments_match_the_checked_output() -> None:
    """Every ``# <output>`` comment after a print in the docs is checked above."""
    for page in PAGES:
        for block in python_blocks(page):
            for line in block.splitlines():
                comment = re.search(r"print\(.*\)\s+# (.+)$", line)
                if comment and not comment.group(1).startswith("..."):
                    assert any(comment.group(1) in e or e in comment.group(1)
                               for e in EXPECTED_OUTPUT[page]), (page, comment.group(1))


def test_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    for page in [*PAGES, "mcp-server.md"]:
        assert f"]({page})" in index
