"""What a user of `envace` meets: every product option says what it does under one name, research
switches live in settings rather than on the product's command lines, and `envace run` says what it is
doing while a model loads."""

import typer
from typer.testing import CliRunner

from envace_mcp.cli import app


def product_options() -> dict[str, list]:
    """`{"run": [options], "traces ls": [...], ...}` for every command but the `lab` group's."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    found: dict[str, list] = {}

    def walk(command, path):
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                if path or name != "lab":
                    walk(command.get_command(ctx, name), [*path, name])
        else:
            found[" ".join(path)] = [p for p in command.params if type(p).__name__.endswith("Option")
                                     and p.name != "help"]
    walk(root, [])
    return found


def test_every_product_option_has_help_and_one_long_name():
    options = product_options()
    assert {"run", "eval", "train sft", "train grpo", "servers serve", "traces ls"} <= set(options)
    silent = [f"{cmd} {p.opts[0]}" for cmd, params in options.items() for p in params if not (p.help or "").strip()]
    assert not silent, silent
    aliased = [f"{cmd} {'/'.join(p.opts)}" for cmd, params in options.items() for p in params
               if len([o for o in p.opts if o.startswith("--")]) > 1]
    assert not aliased, aliased


def test_the_world_model_option_has_one_name_and_the_old_one_says_where_it_went():
    shown = CliRunner().invoke(app, ["run", "--help"]).output
    assert "--world-model" in shown and "--rehearse-adapter" not in shown


def test_research_switches_are_settings_of_run_eval_and_sft_not_product_options():
    runner = CliRunner()
    for command, gone in ((["run"], ("--rehearse ", "--constrain-calls")), (["eval"], ("--rehearse ",)),
                          (["train", "sft"], ("--role",))):
        shown = runner.invoke(app, [*command, "--help"]).output
        assert "--config" in shown and not [flag for flag in gone if flag in shown], (command, shown)


def test_run_takes_test_time_rehearsal_and_constrained_calls_from_its_settings(monkeypatch):
    import envace_mcp.cli.agent as agent

    seen = {}

    async def fake_run(task, servers, model, adapter, mode, rehearse, gate, limits, sampling, traces, yes,
                       constrain_calls, rehearse_adapter):
        seen.update(task=task, rehearse=rehearse, constrain_calls=constrain_calls)

    monkeypatch.setattr(agent, "_run", fake_run)
    done = CliRunner().invoke(app, ["run", "a task", "-c", "rehearse=2", "-c", "constrain_calls=true"])
    assert done.exit_code == 0, done.output
    assert seen == {"task": "a task", "rehearse": 2, "constrain_calls": True}
    CliRunner().invoke(app, ["run", "another"])
    assert seen == {"task": "another", "rehearse": 0, "constrain_calls": False}  # off by default


def test_run_says_on_stderr_what_model_it_loads_before_the_wait(monkeypatch):
    import envace_mcp.policy as policy
    from envace_mcp.errors import UserError

    def slow_load(model, **kwargs):
        raise UserError("stopped at the load")  # the line must already be out

    monkeypatch.setattr(policy, "load_policy", slow_load)
    done = CliRunner().invoke(app, ["run", "a task", "--model", "acme/tiny-model\x1b[2J"])
    assert done.exit_code == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "loading acme/tiny-model\\x1b[2J …"  # named, escaped, before anything is waited on
    assert "stopped at the load" in lines[-1] and "loading" not in done.stdout


def test_the_gates_provenance_line_keeps_each_setting_and_flag_whole_at_any_width(tmp_path, monkeypatch):
    import io
    import json

    from rich.console import Console

    import envace_mcp.cli._common as common

    (tmp_path / "envace.json").write_text(json.dumps({"gate": {
        "rehearse": "all", "block_destructive_on_predicted_failure": True, "min_failure_confidence": 0.7,
        "on_unusable": "block"}}))
    wanted = ["rehearse=all", "block_destructive_on_predicted_failure=true", "min_failure_confidence=0.7",
              "on_unusable=block", "(--gate overrides)"]
    for width in (52, 60, 80, 100, 200):  # from the longest setting, indented, up
        shown = io.StringIO()
        monkeypatch.setattr(common, "console", Console(file=shown, width=width))
        common._agent_gate(None, "acme/model", str(tmp_path))
        lines = shown.getvalue().splitlines()
        assert all(any(piece in line for line in lines) for piece in wanted), (width, lines)
        assert all(len(line) <= width for line in lines), (width, lines)
        assert " ".join(line.strip() for line in lines).replace(", ", ",") == (
            "gate from the adapter's envace.json: rehearse=all,block_destructive_on_predicted_failure=true,"
            "min_failure_confidence=0.7,on_unusable=block (--gate overrides)")
