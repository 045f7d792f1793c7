"""The core imports and runs a flow when fastmcp and mcp cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys

    class BlockMcp:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("fastmcp", "mcp"):
                raise ImportError(f"blocked for this test: {name}")
            return None

    sys.meta_path.insert(0, BlockMcp())
    try:
        import fastmcp  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the import blocker does not work")

    import asyncio
    import chainweaver
    from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, tool

    @tool
    def double(x: int) -> dict:
        return {"x": 2 * x}

    @tool
    async def increment(x: int) -> dict:
        return {"x": x + 1}

    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(double)
    executor.register_tool(increment)
    registry.register_flow(Flow("calc", "", [FlowStep("double"), FlowStep("increment")]))
    result = executor.execute_flow("calc", {"x": 5})
    assert result.success and result.final_output == {"x": 11}, result
    result = asyncio.run(executor.execute_flow_async("calc", {"x": 1}))
    assert result.final_output == {"x": 3}, result
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("fastmcp", "mcp"))
    assert not loaded, loaded
    assert "chainweaver.mcp" not in sys.modules
    print("core ok", chainweaver.__version__)
    """
)


@pytest.mark.slow
def test_core_works_without_fastmcp_and_mcp() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "core ok 0.1.0"
