"""Views over rehearsal memory: the act prompt's memory text and the run summary the CLI prints."""

from envace_mcp.graph.memory import render_memory, summarize

OK = {"status": "result", "result": {"balance": 5}}
FAILS = {"status": "tool_error", "code": "EXECUTION_ERROR", "message": "insufficient funds"}
REAL = {"is_error": False, "content": [{"type": "text", "text": "{}"}], "structured_content": {"balance": 5}}

RECORDS = [
    {"call_id": "a", "tool": "get_balance", "arguments": {}, "prediction": None, "decision": "execute", "real": REAL},
    {"call_id": "b", "tool": "transfer", "arguments": {"amount": 9}, "prediction": FAILS, "decision": "block",
     "reason": "destructive call blocked"},
    {"call_id": "c", "tool": "nope", "arguments": {}, "prediction": None, "decision": "reject", "reason": "unknown tool"},
    {"call_id": "d", "tool": "transfer", "arguments": {"amount": 1}, "prediction": OK, "decision": "ask",
     "approved": True, "real": REAL, "match": 1.0},
    {"call_id": "e", "tool": "transfer", "arguments": {"amount": 2}, "prediction": OK, "decision": "rejected_by_human",
     "approved": False},
    {"call_id": "f", "tool": "set_limit", "arguments": {}, "prediction": FAILS, "decision": "feedback"},
]


def test_the_summary_counts_each_proposed_call_once_by_what_happened_to_it():
    assert summarize(RECORDS) == {
        "proposed": 6, "rehearsed": 4, "predicted_to_fail": 2,
        "stopped": {"block": 1, "reject": 1, "feedback": 1},  # a human's no is a denial, not a gate stop
        "approved": 1, "denied": 1, "executed": 2, "simulated": 0, "compared": 1, "matched": 1,
    }
    assert summarize([])["proposed"] == 0


def test_memory_lists_rehearsed_and_stopped_calls_and_counts_them():
    text = render_memory(RECORDS, notes="Beware of limits.")
    assert text.startswith("Beware of limits.")
    assert "get_balance" not in text  # neither rehearsed nor stopped: nothing to remember
    assert "transfer({\"amount\": 9}): predicted error EXECUTION_ERROR" in text
    assert text.endswith("0 prediction(s) differed from reality; 4 call(s) were stopped by the gate.")
    assert render_memory([]) is None

