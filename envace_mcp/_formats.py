"""The rehearse role's prompt formats: one definition that policies take and traces record, below both (a
trace store reads them without loading the policy package)."""

from __future__ import annotations

from typing import Literal

RehearseFormat = Literal["simulator", "inline"]
"""How the rehearse role is prompted: "simulator" is EnvACE's fresh-chat simulator prompt
(`<execution_result>` answers); "inline" continues the act context right after the proposed call, the
model writing the tool's response turn in its own tool-response format (`policy.prompts.render_inline`).
One definition: policies take it, traces record it."""
