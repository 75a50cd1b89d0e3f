from envace_mcp.cli import main

main()
