"""`python -m envace_mcp.cli ...` (also what `torchrun ... -m envace_mcp.cli train grpo ...` runs)."""

from envace_mcp.cli import main

main()
