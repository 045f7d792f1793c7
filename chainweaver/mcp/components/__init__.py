"""The FastMCP components a FlowServer serves (the flow tool, schema resources,
prompts, tools-only forms) and the one Provider that sources them from the snapshot."""
