"""`envace lab`: the research tools have a group of their own, the product's help reads well in a log,
and the campaign analyses run as modules."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_mcp.cli import app
from envace_mcp.traces import Trace, TraceStore

ANALYSES = sorted(p.stem for p in (Path(__file__).parents[2] / "envace_mcp" / "lab" / "analyses").glob("*.py")
                  if not p.stem.startswith("_"))


def test_the_research_tools_live_under_lab_and_their_old_names_are_gone():
    runner = CliRunner()
    listed = runner.invoke(app, ["lab", "--help"])
    assert listed.exit_code == 0
    assert all(f"  {name} " in listed.output for name in ("reference", "sample", "probe", "plot"))
    for old in (["traces", "reference"], ["traces", "sample"], ["traces", "probe"], ["train", "plot"]):
        gone = runner.invoke(app, [*old, "--help"])
        assert gone.exit_code == 2 and "No such command" in gone.output, old
    product = runner.invoke(app, ["--help"])
    assert "  lab " in product.output and "  traces " in product.output


def test_help_off_a_terminal_is_not_wrapped_and_flags_show_no_type():
    result = CliRunner().invoke(app, ["eval", "--help"])  # stdout is not a terminal here
    assert result.exit_code == 0
    lines = result.output.splitlines()
    suite = next(line for line in lines if line.lstrip().startswith("--suite"))
    assert len(suite) > 80 and "bfcl-irrelevance" in suite  # the whole description on the option's line
    assert "╭" not in result.output  # plain text, not panels cut to 80 columns
    top = CliRunner().invoke(app, ["--help"]).output
    verbose = next(line for line in top.splitlines() if "--verbose" in line)
    assert "<bool>" not in verbose and "show third-party warnings" in verbose


def test_help_on_a_terminal_width_keeps_the_panels_and_flags_show_no_type():
    result = CliRunner().invoke(app, ["lab", "reference", "--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0 and "╭" in result.output
    for flag in ("--logprobs", "--help"):
        line = next(line for line in result.output.splitlines() if flag in line)
        assert "<bool>" not in line, line
    assert "<int" in next(line for line in result.output.splitlines() if "--limit" in line)  # a value keeps its type


def test_lab_plot_draws_several_runs_in_one_png_and_refuses_a_folder_without_metrics(tmp_path):
    for arm, reward in (("sft", 0.2), ("grpo", 0.5)):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": step, "reward": reward + step / 10, "loss": 1 / step}) + "\n" for step in (1, 2))
            + '{"step": 3, "lo')  # a line torn by a kill: skipped
    runner = CliRunner()
    drawn = runner.invoke(app, ["lab", "plot", str(tmp_path / "sft"), str(tmp_path / "grpo"), "--out", str(tmp_path / "arms.png")])
    assert drawn.exit_code == 0, drawn.output
    assert "2 runs plotted" in drawn.output and (tmp_path / "arms.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "empty").mkdir()
    refused = runner.invoke(app, ["lab", "plot", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])
    assert refused.exit_code == 2 and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("name", ANALYSES)
def test_each_campaign_analysis_imports_without_running_and_answers_help(name, monkeypatch, capsys):
    module = importlib.import_module(f"envace_mcp.lab.analyses.{name}")
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    if name == "tts_memory_control":  # every argument goes to `envace eval`; it asks for -c rehearse=N first
        assert stopped.value.code == 2 and "give -c rehearse=N" in capsys.readouterr().err
    else:
        assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out


def test_probe_mix_runs_as_a_module_on_saved_traces(tmp_path):
    refs, other, every = TraceStore(tmp_path / "refs"), TraceStore(tmp_path / "other"), TraceStore(tmp_path / "all")
    for i in range(4):  # two kinds: round 0 (t0, t1) is kept, round 1 dropped (--every 2)
        refs.append(Trace(run_id=f"ref-{i}", task_id=f"t{i}", started_at=0.0))
        other.append(Trace(run_id=f"swap-{i}", started_at=0.0, metadata={"probe": {"of": f"t{i}", "mutation": "swap"}}))
        every.append(Trace(run_id=f"typo-{i}", started_at=0.0, metadata={"probe": {"of": f"t{i}", "mutation": "digit"}}))
    done = subprocess.run([sys.executable, "-m", "envace_mcp.lab.analyses.probe_mix", str(tmp_path / "refs"),
                           str(tmp_path / "other"), str(tmp_path / "all"), str(tmp_path / "mix"), "--kinds", "2",
                           "--typos", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    mixed = [t.run_id for t in TraceStore(tmp_path / "mix").read()]
    assert sorted(mixed[:2]) == ["swap-0", "swap-1"] and mixed[2] in ("typo-0", "typo-1") and mixed[3:] == ["ref-0", "ref-1"]


def test_prompt_tokens_splits_a_prompt_into_prefix_task_memory_and_conversation():
    from envace_mcp.lab.analyses.prompt_tokens import split_prompt
    from envace_mcp.policy.prompts import MEMORY_HEADER

    task = "help"  # also a word of the system prompt: the task is the first user turn's, not that
    memory = MEMORY_HEADER + "Calls so far:\n- transfer(...): predicted {}"
    quoted = f"<tool_response>\n{MEMORY_HEADER}is what the server echoed\n</tool_response>"  # a reply quoting the header
    prompt = (f"<|im_start|>system\nYou help by calling tools.<|im_end|>\n<|im_start|>user\n{task}<|im_end|>\n"
              f"<|im_start|>user\n{quoted}<|im_end|>\n<|im_start|>user\n{memory}<|im_end|>\n"
              "<|im_start|>assistant\n<tool_call>{}</tool_call>")
    spans = split_prompt(prompt, task, "<|im_end|>")
    assert spans["before the task"] == "<|im_start|>system\nYou help by calling tools.<|im_end|>\n<|im_start|>user\n"
    assert spans["task"] == task and spans["memory"] == memory
    assert quoted in spans["conversation"] and spans["conversation"].endswith("<tool_call>{}</tool_call>")
    assert "".join(spans.values()) != prompt and sum(len(v) for v in spans.values()) == len(prompt)
    assert split_prompt(prompt, "a task that is not there", "<|im_end|>") is None
    # a template that ends a turn with a blank line: the memory runs to it, not to the header's own newline
    plain = f"System: tools\n\nUser: {task}\n\nUser: {memory}\n\nAssistant:"
    assert split_prompt(plain, task, "\n\n")["memory"] == memory


def test_prompt_tokens_reads_the_turn_close_off_the_template_and_counts_a_folder(tmp_path):
    from transformers import AutoTokenizer

    from envace_mcp.lab.analyses.prompt_tokens import folder_figures, turn_close
    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.traces.schema import Step

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    assert turn_close(tokenizer) == "<|im_end|>"
    tokenizer.chat_template = None  # `prompt_text` writes plain ChatML for it
    assert turn_close(tokenizer) == "<|im_end|>"
    task = "What is my balance?"
    act = f"<|im_start|>system\nTools.<|im_end|>\n<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n"
    simulator = "<|im_start|>system\nYou simulate tools.<|im_end|>\n<|im_start|>user\nUser: What is my balance?<|im_end|>\n"
    steps = [Step(index=0, role="act", time=0.0, prompt_text=act, prompt_ids=[0] * 30),
             Step(index=1, role="rehearse", time=0.0, prompt_text=simulator, prompt_ids=[0] * 50, format="simulator")]
    TraceStore(tmp_path / "traces").append(Trace(run_id="r", task=task, started_at=0.0, steps=steps))
    (tmp_path / "results.json").write_text('{"runs": null}')  # torn or foreign: no scores, no traceback
    words = lambda text: len(text.split())  # noqa: E731
    figures = folder_figures(tmp_path, words, "<|im_end|>")
    assert figures["generations"] == 2 and figures["mean"] == 40 and figures["unsplit"] == 1 and figures["runs"] == 0
    assert figures["parts"]["task"] == 4 and figures["parts"]["conversation"] == 30 - 4 - figures["parts"]["before the task"]


def test_prompt_tokens_names_a_folder_that_is_not_there(tmp_path, monkeypatch, capsys):
    from envace_mcp.lab.analyses import prompt_tokens

    monkeypatch.setattr(sys, "argv", ["prompt_tokens", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit) as stopped:
        prompt_tokens.main()
    assert stopped.value.code == 2 and "no such folder" in capsys.readouterr().err
