"""One GRPO step per config, run alone (`python ddp_worker.py ...`) or under
`torchrun --nproc_per_node 2 ddp_worker.py ...`; each rank saves its parameters after the step.

    ddp_worker.py MODEL_DIR TRACES_DIR OUT_DIR CONFIGS_JSON
"""

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO

    model_dir, traces, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    rank = int(os.environ.get("RANK", "0"))
    tag = f"rank{rank}" if "WORLD_SIZE" in os.environ else "single"
    for index, overrides in enumerate(json.loads(sys.argv[4])):
        config = GRPOConfig(**{"lr": 1e-2, "steps": 1, "groups_per_step": 2, "lora": False, **overrides,
                               "performance": {"micro_batch": 2, **overrides.get("performance", {})}})
        trainer = OfflineGRPO(config, traces, out / f"{tag}-{index}", model=AutoModelForCausalLM.from_pretrained(model_dir),
                              tokenizer=AutoTokenizer.from_pretrained(model_dir))
        trainer.run()
        named = list(trainer.model.named_parameters())
        torch.save({"params": {n: p.detach() for n, p in named}, "grads": {n: p.grad for n, p in named}},
                   out / f"{tag}-{index}.pt")


if __name__ == "__main__":
    main()
