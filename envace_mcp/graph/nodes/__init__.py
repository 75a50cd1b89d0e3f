"""One module per node: agent (act role), rehearse (rehearse role), gate (pure decision), act (tools)."""
