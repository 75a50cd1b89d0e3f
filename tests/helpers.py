"""Helpers shared by tests (imported as `helpers`; conftest modules are not importable by name)."""

from __future__ import annotations

import time
from pathlib import Path

TESTS = Path(__file__).parent
PROBE = str(TESTS / "probe_server.py")


def logged_calls(path: Path) -> list[dict]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def children_of(pid: int) -> set[int]:
    """Every live descendant of `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def random_lora(model_dir: Path, out: Path, seed: int, formats: tuple[str, str] | None = None) -> Path:
    """A LoRA adapter with random (non-zero) weights on a tiny model, and optionally its envace.json
    (tool format, rehearse format)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.policy.tool_text import write_adapter_format

    torch.manual_seed(seed)
    get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                   LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(out)
    if formats:
        write_adapter_format(out, *formats)
    return out
