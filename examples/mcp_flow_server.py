"""ChainWeaver example MCP server: a small bookshop catalogue published as tools,
schema resources and prompts, under one governance filter.

    python examples/mcp_flow_server.py                 # serve over stdio (Claude Desktop, VS Code)
    python examples/mcp_flow_server.py --transport streamable-http --host 127.0.0.1 --port 8000
    python examples/mcp_flow_server.py --demo          # start it, connect a client, walk through
    fastmcp run examples/mcp_flow_server.py            # FastMCP's CLI finds the ``mcp`` instance

Three flows are exposed (read-only, active). Three are registered but excluded, each
for a different reason, so the filter is visible: a draft, a flow that writes, and a
flow whose tool declares no safety contract.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from typing import Any, Literal

from fastmcp import Client
from fastmcp.client.logging import LogMessage
from fastmcp.client.transports import ClientTransport, StdioTransport
from pydantic import BaseModel, Field

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowLifecycle,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    PromptArgument,
    PromptMessage,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import FlowServer, RunHistory, SecurityConfig, ServingConfig

READ = ToolSafetyContract(SideEffectLevel.READ, idempotent=True)
PURE = ToolSafetyContract(SideEffectLevel.NONE, idempotent=True)

Genre = Literal["any", "fiction", "history", "science", "children"]

BOOKS: list[dict[str, Any]] = [
    {"isbn": "978-0-14-143951-8", "title": "Pride and Prejudice", "author": "Jane Austen",
     "genre": "fiction", "price_cents": 899, "rating": 4.6, "stock": 12},
    {"isbn": "978-0-393-31755-8", "title": "Guns, Germs, and Steel", "author": "Jared Diamond",
     "genre": "history", "price_cents": 1899, "rating": 4.3, "stock": 4},
    {"isbn": "978-0-553-38016-3", "title": "A Brief History of Time", "author": "Stephen Hawking",
     "genre": "science", "price_cents": 1850, "rating": 4.7, "stock": 0},
    {"isbn": "978-0-06-112008-4", "title": "To Kill a Mockingbird", "author": "Harper Lee",
     "genre": "fiction", "price_cents": 1099, "rating": 4.8, "stock": 7},
    {"isbn": "978-0-394-80001-1", "title": "The Cat in the Hat", "author": "Dr. Seuss",
     "genre": "children", "price_cents": 999, "rating": 4.5, "stock": 30},
    {"isbn": "978-0-7432-7356-5", "title": "The Guns of August", "author": "Barbara Tuchman",
     "genre": "history", "price_cents": 2000, "rating": 4.4, "stock": 2},
]
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85}


# ------------------------------------------------------------------ schemas


class SearchRequest(BaseModel):
    query: str = Field(description="Words to look for in titles and authors",
                       examples=["history", "austen"])
    genre: Genre = Field("any", description="Only books of this genre")
    in_stock: bool = Field(False, description="Only books that can ship today")
    limit: int = Field(3, ge=1, le=20, description="How many books to return")


class Matches(BaseModel):
    query: str
    limit: int
    books: list[dict[str, Any]]


class SearchResults(BaseModel):
    titles: list[str] = Field(description="Matching titles, best rated first")
    count: int = Field(description="How many books are listed")


class BookRequest(BaseModel):
    isbn: str = Field(description="ISBN-13 with hyphens", examples=["978-0-14-143951-8"],
                      pattern=r"^97[89]-[0-9-]{13}$")


class BookRecord(BaseModel):
    title: str
    author: str
    price_cents: int
    stock: int


class BookCard(BaseModel):
    card: str = Field(description="One line describing the book for a customer")
    available: bool = Field(description="Whether the book ships today")


class PriceRequest(BaseModel):
    isbn: str = Field(description="ISBN-13 with hyphens", examples=["978-0-06-112008-4"],
                      pattern=r"^97[89]-[0-9-]{13}$")
    currency: Literal["EUR", "USD", "GBP"] = Field("EUR", description="Currency to quote in")


class PriceQuote(BaseModel):
    price: str = Field(description="The price, formatted with its currency")


# -------------------------------------------------------------------- tools


@tool(safety=READ)
def find_books(data: SearchRequest) -> Matches:
    """Find books whose title or author contains the query."""
    words = data.query.lower()
    found = [book for book in BOOKS
             if (words in book["title"].lower() or words in book["author"].lower()
                 or words == book["genre"])
             and data.genre in ("any", book["genre"])
             and (book["stock"] > 0 or not data.in_stock)]
    return Matches(query=data.query, limit=data.limit, books=found)


@tool(safety=PURE)
def rank_by_rating(books: list[dict[str, Any]], limit: int) -> SearchResults:
    """Order books by rating and keep the best ``limit``."""
    best = sorted(books, key=lambda book: book["rating"], reverse=True)[:limit]
    return SearchResults(titles=[book["title"] for book in best], count=len(best))


def _book(isbn: str) -> dict[str, Any]:
    for book in BOOKS:
        if book["isbn"] == isbn:
            return book
    raise LookupError(f"no book with ISBN {isbn}")


@tool(safety=READ)
def lookup_book(isbn: str) -> BookRecord:
    """Fetch one book's record by ISBN."""
    return BookRecord(**_book(isbn))


@tool(safety=PURE)
def format_card(title: str, author: str, price_cents: int, stock: int) -> BookCard:
    """Describe a book in one line."""
    shipping = "ships today" if stock else "back in stock soon"
    return BookCard(card=f"{title} by {author}, EUR {price_cents / 100:.2f}, {shipping}",
                    available=stock > 0)


@tool(safety=PURE)
def convert_price(price_cents: int, currency: str) -> PriceQuote:
    """Convert a EUR price into another currency."""
    return PriceQuote(price=f"{currency} {price_cents * RATES[currency] / 100:.2f}")


@tool(safety=ToolSafetyContract(SideEffectLevel.WRITE))
def reserve_copy(isbn: str) -> dict:
    """Hold one copy of a book for a customer (changes stock)."""
    _book(isbn)["stock"] -= 1
    return {"reserved": isbn}


@tool  # no safety contract: governance cannot tell what it does, so it stays private
def legacy_inventory(isbn: str) -> dict:
    """Ask the old inventory system about a book."""
    return {"isbn": isbn, "source": "legacy"}


# -------------------------------------------------------------------- flows

GIFT_PROMPTS = [
    FlowPrompt(
        "gift_ideas",
        title="Gift ideas",
        description="Ask for a book gift suggestion for someone.",
        arguments=[PromptArgument("recipient", "Who the gift is for", required=True),
                   PromptArgument("interests", "What they enjoy")],
        messages=[PromptMessage("user", "Suggest a book for {{ recipient }}, who enjoys "
                                        "{{ interests }}. Use the book_search tool to find "
                                        "titles in stock before you answer.")],
    ),
]


def build_executor() -> FlowExecutor:
    """The bookshop: seven tools and six flows, three of which governance excludes."""
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for each in (find_books, rank_by_rating, lookup_book, format_card, convert_price,
                 reserve_copy, legacy_inventory):
        executor.register_tool(each)
    for flow in (
        Flow("book_search", "Search the bookshop by title, author or genre, best rated first.",
             [FlowStep("find_books"), FlowStep("rank_by_rating")], version="1.2.0",
             title="Book search", input_schema=SearchRequest, output_schema=SearchResults,
             governance=FlowGovernance(owner="catalogue-team"), prompts=GIFT_PROMPTS),
        Flow("book_card", "Describe one book for a customer: title, author, price, stock.",
             [FlowStep("lookup_book"), FlowStep("format_card")], title="Book card",
             input_schema=BookRequest, output_schema=BookCard),
        Flow("book_price", "Quote a book's price in EUR, USD or GBP.",
             [FlowStep("lookup_book"), FlowStep("convert_price")], title="Book price",
             input_schema=PriceRequest, output_schema=PriceQuote),
        # Registered, but excluded by the default policy: each for a different reason.
        Flow("similar_books", "Recommend books similar to a title (not reviewed yet).",
             [FlowStep("find_books"), FlowStep("rank_by_rating")], input_schema=SearchRequest,
             governance=FlowGovernance(lifecycle=FlowLifecycle.DRAFT)),
        Flow("reserve_book", "Reserve a copy of a book.", [FlowStep("reserve_copy")]),
        Flow("legacy_stock", "Stock from the legacy inventory.", [FlowStep("legacy_inventory")]),
    ):
        registry.register_flow(flow)
    return executor


def build_server(security: SecurityConfig | None = None) -> FlowServer:
    """The example server: every primitive on, default governance policy, and a run
    history in memory (each run's record readable as chainweaver://runs/{run_id})."""
    return FlowServer(build_executor(), expose_schemas=True, expose_prompts=True,
                      security=security, serving=ServingConfig(name="chainweaver-bookshop"),
                      run_history=RunHistory())


# FastMCP's CLI (`fastmcp run examples/mcp_flow_server.py`) looks for a FastMCP
# instance named ``mcp``.
flow_server = build_server()
mcp = flow_server.fastmcp


# --------------------------------------------------------------------- demo


def _section(number: int, title: str) -> None:
    print(f"\n== {number}. {title} " + "=" * max(0, 60 - len(title)))


def _print_exposure(server: FlowServer) -> None:
    # Deciding the exposure logs a warning per excluded flow (on stderr, with no logging
    # configured); the report below gives the same reasons, so they are held back here.
    exposure_log = logging.getLogger("chainweaver.mcp")
    level = exposure_log.level
    exposure_log.setLevel(logging.ERROR)
    try:
        report = server.exposure_report()
    finally:
        exposure_log.setLevel(level)
    for entry in report:
        if entry.exposed:
            print(f"  EXPOSED   {entry.flow_name} {entry.version}: tool {entry.tool_name}, "
                  f"{len(entry.resource_uris)} resource(s), prompts {list(entry.prompt_names)}")
        else:
            print(f"  EXCLUDED  {entry.flow_name} {entry.version}: {entry.reason}")


async def run_demo() -> None:
    """Start this script as a stdio MCP server, connect a client and walk through it."""
    print("ChainWeaver demo: the bookshop example served over stdio to a real MCP client.")
    _section(1, "Exposure report (one decision for every primitive)")
    _print_exposure(flow_server)

    # The server's own log (its startup line, its exclusion warnings) goes to a file so
    # the walk-through stays readable; it is shown if anything goes wrong.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as server_log:
        try:
            await _walk_through(StdioTransport(sys.executable, [__file__], log_file=server_log))
        except BaseException:
            server_log.seek(0)
            print("--- server log ---\n" + server_log.read(), file=sys.stderr)
            raise
    print("\nDemo complete.")


class ServerLog:
    """The log messages the server sends the client (MCP notifications/message).

    FastMCP's client would log each through its own rich-formatted logger; the demo
    collects them instead and prints them as part of its walk-through.
    """

    def __init__(self) -> None:
        self.messages: list[LogMessage] = []

    async def __call__(self, message: LogMessage) -> None:
        self.messages.append(message)

    def print_received(self) -> None:
        """Print the messages received since the last call, one line each."""
        for message in self.messages:
            data = message.data
            text = data.get("msg", data) if isinstance(data, dict) else data
            source = f" {message.logger}" if message.logger else ""
            print(f"  server log ({message.level}{source}): {text}")
        self.messages.clear()


async def _walk_through(transport: ClientTransport) -> None:
    server_log = ServerLog()
    async with Client(transport, log_handler=server_log) as client:
        _section(2, "Tools (tools/list)")
        for listed in await client.list_tools():
            hints = listed.annotations
            read_only = bool(hints and hints.read_only_hint)
            print(f"  {listed.name:<12} {listed.title!r:<16} read-only={read_only}  "
                  f"inputs={sorted(listed.input_schema.get('properties', {}))}")

        _section(3, "Resources (resources/list, resources/templates/list)")
        for resource in await client.list_resources():
            print(f"  {resource.uri}  ({resource.title})")
        for template in await client.list_resource_templates():
            print(f"  template {template.uri_template}")

        _section(4, "Prompts (prompts/list)")
        for prompt in await client.list_prompts():
            arguments = [a.name + ("*" if a.required else "") for a in prompt.arguments or []]
            print(f"  {prompt.name:<24} arguments={arguments}")

        _section(5, "Read one schema resource")
        contents = await client.read_resource("chainweaver://flows/book_search/schema")
        document = json.loads(contents[0].text)
        print(f"  {document['tool_name']} {document['version']}: "
              f"inputs {sorted(document['input_schema']['properties'])}, "
              f"outputs {sorted(document['output_schema']['properties'])}")

        _section(6, "Render the invocation prompt for book_search")
        rendered = await client.get_prompt("book_search", {"query": "history", "in_stock": "true"})
        print("  " + rendered.messages[0].content.text.replace("\n", "\n  "))
        arguments = rendered.meta["chainweaver"]["arguments"]

        _section(7, "Call the tool with the prompt's arguments")
        print(f"  tools/call book_search {json.dumps(arguments, sort_keys=True)}")
        result = await client.call_tool("book_search", arguments)
        server_log.print_received()  # the flow reports each step to the caller
        print(f"  -> {json.dumps(result.structured_content, sort_keys=True)}")

        _section(8, "An excluded flow answers like one that never existed")
        for name in ("reserve_book", "no_such_flow"):
            answer = await client.call_tool(name, {"isbn": "978-0-14-143951-8"},
                                            raise_on_error=False)
            print(f"  tools/call {name}: isError={answer.is_error} "
                  f"{answer.content[0].text!r}")
        server_log.print_received()

        _section(9, "The call's run record (only its caller can read it)")
        run_uri = f"chainweaver://runs/{result.meta['chainweaver']['run_id']}"
        record = json.loads((await client.read_resource(run_uri))[0].text)
        print(f"  {run_uri}\n  {record['flow']} {record['version']}: {record['status']}, "
              f"output {record['output_size']} bytes, sha256 {record['output_sha256'][:16]}…")
        for step in record["steps"]:
            print(f"    step {step['id']}: {step['status']}, {step['attempts']} attempt(s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true",
                        help="start the server, connect a client, print a walk-through, exit")
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    # Beyond 127.0.0.1, localhost and [::1] with the port (DNS-rebinding protection):
    parser.add_argument("--allowed-host", action="append", metavar="HOST",
                        help="also accept this Host header over HTTP; repeatable")
    parser.add_argument("--allowed-origin", action="append", metavar="ORIGIN",
                        help="also accept this Origin header over HTTP; repeatable")
    args = parser.parse_args(argv)
    if args.demo:
        asyncio.run(run_demo())
        return
    server = flow_server
    if args.allowed_host or args.allowed_origin:
        if args.transport != "streamable-http":
            parser.error("--allowed-host and --allowed-origin need --transport streamable-http")
        server = build_server(SecurityConfig(allowed_hosts=args.allowed_host,
                                             allowed_origins=args.allowed_origin))
    if args.transport == "streamable-http":
        print(f"Serving on http://{args.host}:{args.port}/mcp", file=sys.stderr)
    server.serve(args.transport, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
