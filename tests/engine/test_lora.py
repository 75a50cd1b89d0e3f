"""Generation under a LoRA adapter: on merged copies of the adapted weights, the adapter left trainable."""

import threading

import pytest
import torch

from envace_mcp.engine import Engine, Job, SamplingParams, load_model
from envace_mcp.engine.lora import merged_lora


def prompt(engine, chat):
    text = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_generation_runs_on_merged_lora_weights_and_leaves_the_adapter_trainable(tiny_qwen3_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    for name, dora in (("plain", False), ("dora", True)):
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
        config = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False,
                            use_dora=dora)
        get_peft_model(base, config).save_pretrained(tmp_path / name)
    engine = Engine(*load_model(str(tiny_qwen3_dir), adapter=str(tmp_path / "plain")))
    model = engine.model
    ids = torch.tensor([engine.tokenizer("merge me, then train me")["input_ids"]])
    for n, p in model.named_parameters():  # as a trainer would have it (loaded adapters come frozen)
        p.requires_grad_("lora_" in n)
    params = dict(model.named_parameters())
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with merged_lora(model) as merged:
            assert merged
            during = model(input_ids=ids).logits
            assert all("forward" in m.__dict__ for m in model.modules() if hasattr(m, "lora_A"))
            other: dict = {}  # a training step starting while a stream's worker thread winds down
            thread = threading.Thread(target=lambda: other.update(out=model(input_ids=ids).logits))
            thread.start()
            thread.join()
            assert other["out"].requires_grad  # (grad mode is per thread)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after) and torch.allclose(before, during, atol=1e-4)
    assert torch.equal(before, other["out"].detach())  # other threads never see the merge: peft's path, own weights
    assert not torch.equal(before, during)  # really the merged copies, not the same path
    assert dict(model.named_parameters()) == params  # the very same parameter objects back
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [n for n in params if "lora_" in n]
    assert all("forward" not in m.__dict__ for m in model.modules() if hasattr(m, "lora_A"))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()  # the adapter still trains
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)
    model.eval()
    jobs = [Job(prompt(engine, [{"role": "user", "content": "word " * (i + 3)}]),
                 SamplingParams(max_new_tokens=10, temperature=0.9), seed=i) for i in range(3)]
    merged_runs = engine.generate(jobs)
    engine.merge_lora = False
    separate = engine.generate(jobs)
    for a, b in zip(merged_runs, separate):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    engine.merge_lora = True
    with torch.no_grad():  # an optimizer step on the adapter: the next generation samples from it
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5 * torch.randn_like(p))
    updated = engine.generate(jobs)  # (the prefix cache's keys/values from the old weights are dropped)
    for job, old, new in zip(jobs, merged_runs, updated):
        fresh = engine.score(job.prompt_ids, new.completion_ids, temperature=0.9)  # the adapter path, no merge
        assert max(abs(x - y) for x, y in zip(fresh, new.logprobs)) < 1e-4
        stale = engine.score(job.prompt_ids, old.completion_ids, temperature=0.9)
        assert max(abs(x - y) for x, y in zip(stale, old.logprobs)) > 1e-3  # the weights really moved
    widths: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:  # scored after the prompt's cached keys/values: only the last prompt token and the reply run
        for job, new in zip(jobs, updated):
            widths.clear()
            cached = engine.score(job.prompt_ids, new.completion_ids, temperature=0.9, reuse_prefix=True)
            assert widths == [len(new.completion_ids) + 1]
            assert max(abs(x - y) for x, y in zip(cached, new.logprobs)) < 1e-4
    finally:
        hook.remove()
    engine.weights_changed()  # none cached: the whole prompt runs, the same numbers
    for job, new in zip(jobs, updated):
        assert engine.score(job.prompt_ids, new.completion_ids, temperature=0.9, reuse_prefix=True) == pytest.approx(
            new.logprobs, abs=1e-4)
    dora, _ = load_model(str(tiny_qwen3_dir), adapter=str(tmp_path / "dora"))
    with merged_lora(dora) as merged:
        assert not merged  # not a plain merge: generates through peft as before
