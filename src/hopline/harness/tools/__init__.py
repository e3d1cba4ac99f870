"""The harness's tools (SPEC H-7): one workspace's tools (:mod:`.workspace`, one dispatch table),
a gate session's sandboxed commands and diff (:mod:`.reviewing`), which commands a review may run
(:mod:`.policy`), a tool's environment (:mod:`.env`), capping for the model with structured cut
markers (:mod:`.capping`), running a command (:mod:`.commands`), the schemas (:mod:`.schemas`).
"""

from hopline.errors import ToolError
from hopline.harness.tools.capping import Cut, cap_for_model, cap_with_cut
from hopline.harness.tools.env import tool_environment
from hopline.harness.tools.policy import REVIEW_COMMANDS, check_review_command
from hopline.harness.tools.results import ToolInfo, ToolOutcome, resolve_inside
from hopline.harness.tools.reviewing import ReviewRange
from hopline.harness.tools.schemas import TOOL_NAMES, tool_schemas
from hopline.harness.tools.workspace import OUTPUT_PREFIX, TOOLS, Workspace

__all__ = ["OUTPUT_PREFIX", "REVIEW_COMMANDS", "TOOLS", "TOOL_NAMES", "Cut", "ReviewRange", "ToolError",
           "ToolInfo", "ToolOutcome", "Workspace", "cap_for_model", "cap_with_cut", "check_review_command",
           "resolve_inside", "tool_environment", "tool_schemas"]
