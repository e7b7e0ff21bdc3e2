"""Every tool an agent can call, in the order they are listed."""

from __future__ import annotations

from typing import Any

from rlctl.service.tools.dataset_tools import DATASET_TOOLS
from rlctl.service.tools.environment_tools import ENVIRONMENT_TOOLS
from rlctl.service.tools.inference_tools import INFERENCE_TOOLS
from rlctl.service.tools.registry import Tool, ToolNotFound
from rlctl.service.tools.rl_tools import EVALUATION_TOOLS, RL_TOOLS

# The reference's ten first (rl_test_inference last of them), then the others.
ALL_TOOLS: tuple[Tool[Any], ...] = (*RL_TOOLS, *INFERENCE_TOOLS, *EVALUATION_TOOLS, *DATASET_TOOLS, *ENVIRONMENT_TOOLS)
_BY_NAME = {tool.name: tool for tool in ALL_TOOLS}


def find_tool(name: str) -> Tool[Any]:
    tool = _BY_NAME.get(name)
    if tool is None:
        raise ToolNotFound(f"no tool named {name!r}", {"available": list(_BY_NAME)})
    return tool
