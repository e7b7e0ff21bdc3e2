"""Agent tool backend: the rl_* tools over REST (/tools) and MCP (/mcp), with persisted tool sessions."""
