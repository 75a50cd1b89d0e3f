"""graphs/langgraph.json: the served graph loads without starting anything; servers start on first run."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.envs import get_suite
from envace_mcp.errors import UserError
from envace_mcp.graph.served import close_shared
from envace_mcp.policy.trust import weights_digest, write_trust
from envace_mcp.testing import ScriptedPolicy
from helpers import PROBE, children_of, wait_until

pytestmark = pytest.mark.anyio
GRAPHS = Path(__file__).parent.parent.parent / "graphs"


def load_served_graph():
    spec = importlib.util.spec_from_file_location("envace_served_graph", GRAPHS / "envace_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as LangGraph's loader does; dataclasses need it
    spec.loader.exec_module(module)
    return module


def test_langgraph_json_names_the_graph_module():
    config = json.loads((GRAPHS / "langgraph.json").read_text())
    path, _, attribute = config["graphs"]["envace"].partition(":")
    assert (GRAPHS / path).exists() and attribute == "graph"


async def test_reading_the_graph_starts_no_server_and_the_first_run_does(tmp_path, monkeypatch):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE]}}}))
    monkeypatch.setenv("ENVACE_SERVERS", str(config))
    before = children_of(os.getpid())
    module = load_served_graph()
    graph = module.graph
    graph.get_graph().draw_mermaid()
    graph.get_input_jsonschema()
    graph.get_context_jsonschema()
    assert children_of(os.getpid()) == before  # nothing started by reading
    policy = ScriptedPolicy(act=['<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', "done"])
    try:
        context = module.ServedContext(policy=policy)
        assert context.servers == str(config)
        out = await graph.ainvoke({"messages": [HumanMessage(content="say hi")]}, context=context)
        assert out["final_answer"] == "done" and out["real_calls"] == 1
        assert len(children_of(os.getpid()) - before) >= 1  # the probe server runs now
    finally:
        close_shared()
    assert wait_until(lambda: children_of(os.getpid()) == before)


async def test_the_gate_arrives_as_json_settings_and_a_bad_one_fails_before_anything_starts(tmp_path, monkeypatch):
    """A served run's context is JSON: its gate is a dict of GateConfig settings, not a GateConfig."""
    from envace_mcp.errors import UserError

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE]}}}))
    monkeypatch.setenv("ENVACE_SERVERS", str(config))
    graph = load_served_graph().graph
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    before = children_of(os.getpid())
    try:
        for context, says in [({"limits": {"max_steps": 0}}, "the context's limits: max_steps must be greater than or equal to 1"),
                              ({"gate": {"colour": "red"}}, "the context's gate: unknown setting 'colour' .known: rehearse, "),
                              ({"gate": {"max_steps": 1}}, "the context's gate: max_steps is not a gate setting: it is a run limit"),
                              ({"gate": ["max_steps"]}, "must be an object")]:
            with pytest.raises(UserError, match=says):
                await graph.ainvoke({"messages": [HumanMessage(content="say hi")]},
                                    context={"policy": ScriptedPolicy(act=[call]), **context})
        assert children_of(os.getpid()) == before  # no server started for a bad gate
        out = await graph.ainvoke({"messages": [HumanMessage(content="say hi")]},
                                  context={"policy": ScriptedPolicy(act=[call, call, "done"]), "limits": {"max_steps": 1}})
        assert out["status"] == "max_steps" and out["real_calls"] == 1  # one agent turn, as the JSON said
    finally:
        close_shared()


def test_a_served_context_starts_from_the_gate_its_adapter_recommends_and_its_own_settings_win(tmp_path, tiny_qwen3_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.served import ServedContext

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), LoraConfig(r=2, target_modules=["q_proj"])
                   ).save_pretrained(adapter)
    (adapter / "envace.json").write_text(json.dumps({"gate": {"on_unusable": "block", "rehearse": "all"}}))
    try:
        gate = ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), gate={"rehearse": "none"}).load().gate
        assert gate == GateConfig(on_unusable="block", rehearse="none")
        assert ServedContext(model=str(tiny_qwen3_dir), adapter="none").load().gate == GateConfig()
        chosen = GateConfig(approve_blocked=True)  # a GateConfig given in Python is used as it is
        assert ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), gate=chosen).load().gate is chosen
        given = ServedContext(policy=ScriptedPolicy(act=["done"]), adapter=str(adapter)).load().gate
        assert given == GateConfig()  # the adapter named does not describe a policy given as an object
        world = tmp_path / "world"  # a world model of its own: its recommendation, and it rehearses
        get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), LoraConfig(r=2, target_modules=["q_proj"])
                       ).save_pretrained(world)
        (world / "envace.json").write_text(json.dumps({"gate": {"min_failure_confidence": 0.6}}))
        with pytest.raises(UserError, match="has no report"):  # a deployment reads only a measured world model
            ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), rehearse_adapter=str(world)).load()
        write_trust(world, {}, {}, weights_digest(world))  # measured on nothing: it earns nothing, and says so
        served = ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), rehearse_adapter=str(world)).load()
        assert served.gate == GateConfig(min_failure_confidence=0.6, trust={})  # its table: nothing earned
        assert served.policy.name == f"{tiny_qwen3_dir} + rehearse adapter {world}"
    finally:
        close_shared()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_langgraph_dev_serves_the_graph_and_a_run_over_its_http_api_completes_without_allow_blocking(tmp_path):
    """`cd graphs && langgraph dev`, as a LangGraph user runs it: the default model (the embedded one with
    the shipped adapter) and the bundled servers load on the first run, off the server's event loop."""
    import signal
    import subprocess
    import urllib.request

    from envace_mcp.envs.launch import free_port, wait_for_port

    import shutil

    langgraph = Path(sys.executable).parent / "langgraph"
    assert langgraph.exists(), "langgraph-cli[inmem] is a test dependency (pip install -e '.[test]')"
    served = tmp_path / "graphs"  # a copy: the dev server keeps its state in .langgraph_api/ beside the config
    shutil.copytree(GRAPHS, served, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__"))
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("ENVACE_SERVERS", None)
    env["ENVACE_GATE"] = "require_approval=never"  # the deployment's choice for a run nobody attends
    log = open(tmp_path / "langgraph-dev.log", "wb")
    server = subprocess.Popen([str(langgraph), "dev", "--port", str(port), "--no-browser", "--no-reload"],
                              cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, server, 120)
        question = get_suite("bank").split("test")[0].instruction  # `envace demo`'s task, phrased as trained
        body = {"assistant_id": "envace", "input": {"messages": [{"role": "user", "content": question}]}}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/runs/wait", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=800) as response:
            out = json.loads(response.read())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
    logged = (tmp_path / "langgraph-dev.log").read_text(errors="replace")
    assert "__error__" not in out, logged[-3000:]
    assert "BlockingError" not in logged
    assert out["status"] in ("finished", "max_steps") and out["steps"] >= 1
    # the shipped adapter makes the embedded model call tools (the bare model never does)
    assert any(m.get("tool_calls") for m in out["messages"] if m["type"] == "ai"), out["messages"]
    assert out["rehearsals"] and any(r.get("real") for r in out["rehearsals"])  # a real MCP server answered


# ------------------------------------------------- what an API caller may set (through `langgraph dev`)

SCRIPTED_GRAPH = '''"""The served graph, its policy needing no model: the user's message is the agent's first turn."""
from dataclasses import dataclass, field

from envace_mcp.graph import create_envace_graph
from envace_mcp.graph.served import DeployedContext
from envace_mcp.graph.state import PolicyService
from envace_mcp.testing import FunctionPolicy


def scripted():
    return FunctionPolicy(act=lambda r: "done" if r.messages else r.task,
                          rehearse=lambda r: '<execution_result>"ok"</execution_result>')


@dataclass
class ScriptedContext(DeployedContext):
    policy: PolicyService = field(default_factory=scripted)


builder = create_envace_graph()
builder.context_schema = ScriptedContext
graph = builder.compile()
'''
CHECKOUT = ('<tool_call>{"name": "checkout", "arguments": {"basket": {"customer": "ann", '
            '"lines": [{"sku": "a", "qty": 1}]}}}</tool_call>')
ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'


class DevServer:
    """`langgraph dev` on a free loopback port serving SCRIPTED_GRAPH, its deployment set by langgraph.json's
    `env`; `run(message, context)` posts one stateless run and returns its output."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        import subprocess

        from envace_mcp.envs.launch import free_port, wait_for_port

        folder.mkdir()
        (folder / "scripted_graph.py").write_text(SCRIPTED_GRAPH)
        (folder / "langgraph.json").write_text(json.dumps({"dependencies": ["."], "env": env,
                                                           "graphs": {"scripted": "./scripted_graph.py:graph"}}))
        self.port = free_port()
        self.log_path = folder / "langgraph-dev.log"
        self._log = open(self.log_path, "wb")
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ENVACE_")}
        self.server = subprocess.Popen(
            [str(Path(sys.executable).parent / "langgraph"), "dev", "--host", "127.0.0.1", "--port", str(self.port),
             "--no-browser", "--no-reload"], cwd=folder, stdout=self._log, stderr=subprocess.STDOUT,
            env={**clean, "PATH": path, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false",
                 "HF_HUB_OFFLINE": "1"}, start_new_session=True)
        try:
            wait_for_port(self.port, self.server, 120)
        except BaseException:
            self.close()
            raise

    def run(self, message: str, context: dict | None = None) -> dict:
        import urllib.request

        body = {"assistant_id": "scripted", "input": {"messages": [{"role": "user", "content": message}]},
                "context": context or {}}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/runs/wait", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def close(self) -> None:
        import signal
        import subprocess

        os.killpg(self.server.pid, signal.SIGTERM)
        try:
            self.server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self._log.close()

    @property
    def logged(self) -> str:
        return self.log_path.read_text(errors="replace")


def deployment(tmp_path: Path) -> tuple[dict[str, str], Path, Path, Path]:
    """The probe server as the deployment's toolbox (its calls logged), and another config a caller might
    name, whose command writes a marker when it is spawned and then serves the probe (its calls logged apart)."""
    probe_log, other_log, marker = tmp_path / "probe.jsonl", tmp_path / "other.jsonl", tmp_path / "spawned"
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE],
                                                            "env": {"PROBE_LOG": str(probe_log)}}}}))
    spawn = (f"import runpy, sys; open({str(marker)!r}, 'w').close(); sys.argv = [{PROBE!r}]; "
             f"runpy.run_path({PROBE!r}, run_name='__main__')")
    (tmp_path / "other.json").write_text(json.dumps({"mcpServers": {"probe": {
        "command": sys.executable, "args": ["-c", spawn], "env": {"PROBE_LOG": str(other_log)}}}}))
    return {"ENVACE_SERVERS": str(servers)}, probe_log, other_log, marker


@pytest.mark.timeout(300)
def test_an_api_caller_may_tighten_the_deployments_gate_but_not_loosen_it_nor_choose_what_is_spawned(tmp_path):
    from helpers import logged_calls

    env, probe_log, other_log, marker = deployment(tmp_path)
    served = DevServer(tmp_path / "served", {**env, "ENVACE_GATE": "require_approval=destructive",
                                             "ENVACE_LIMITS": "max_steps=3"})
    try:
        asked = served.run(CHECKOUT)  # the deployment's gate: a destructive call waits for approval
        assert asked["__interrupt__"][0]["value"]["name"] == "checkout", asked
        for context, names in [({"gate": {"require_approval": "never"}}, 'require_approval="never"'),
                               ({"limits": {"max_steps": 5}}, "max_steps=5 over the deployment's 3"),
                               ({"gate": {"approve_blocked": True}}, "approve_blocked"),
                               ({"servers": str(tmp_path / "other.json")}, "may not set servers"),
                               ({"model": "gpt2"}, "may not set model"),
                               ({"policy": "gpt2"}, "cannot set policy")]:
            out = served.run(CHECKOUT, context)
            assert "__interrupt__" not in out and names in out.get("__error__", {}).get("message", ""), (context, out)
        assert logged_calls(probe_log) == [] and not marker.exists()  # nothing ran, nothing was spawned
        tight = served.run(ECHO, {"limits": {"max_steps": 1}})
        assert tight["status"] == "max_steps" and tight["real_calls"] == 1 and tight["steps"] == 1, tight
        always = served.run(ECHO, {"gate": {"require_approval": "always"}})
        assert always["__interrupt__"][0]["value"]["name"] == "echo"  # a read-only call asks too
        simulated = served.run(CHECKOUT, {"mode": "simulated"})  # fewer real calls: allowed
        assert "__error__" not in simulated and simulated["real_calls"] == 0
        assert [c["tool"] for c in logged_calls(probe_log)] == ["echo"] and not marker.exists()
    finally:
        served.close()
    assert "may not set servers" in served.logged  # the refusal is in the server's log too


@pytest.mark.timeout(300)
def test_a_deployment_that_allows_it_lets_callers_choose_the_servers_and_loosen_the_gate(tmp_path):
    from helpers import logged_calls

    env, probe_log, other_log, marker = deployment(tmp_path)
    served = DevServer(tmp_path / "served", {**env, "ENVACE_GATE": "require_approval=destructive",
                                             "ENVACE_ALLOW_CONTEXT": "servers,gate"})
    try:
        out = served.run(CHECKOUT, {"gate": {"require_approval": "never"}})
        assert "__interrupt__" not in out and out["real_calls"] == 1, out
        assert [c["tool"] for c in logged_calls(probe_log)] == ["checkout"]
        out = served.run(ECHO, {"servers": str(tmp_path / "other.json")})
        assert out["real_calls"] == 1 and marker.exists(), out
        assert [c["tool"] for c in logged_calls(other_log)] == ["echo"]
        refused = served.run(ECHO, {"model": "gpt2"})  # not in ENVACE_ALLOW_CONTEXT
        assert "may not set model" in refused.get("__error__", {}).get("message", ""), refused
    finally:
        served.close()


def test_a_served_graph_logs_the_gate_its_adapter_recommends_and_warns_when_it_stops_fewer_calls(
        tmp_path, tiny_qwen3_dir, monkeypatch, caplog):
    """As `envace demo` prints it: a run never hides where a gate setting came from."""
    import logging

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.served import DeployedContext, ServedContext
    from helpers import random_lora

    strict = random_lora(tiny_qwen3_dir, tmp_path / "strict", 1)
    trusting = random_lora(tiny_qwen3_dir, tmp_path / "trusting", 2)
    (strict / "envace.json").write_text(json.dumps({"gate": {"block_destructive_on_unusable_rehearsal": True}}))  # an old one
    (trusting / "envace.json").write_text(json.dumps({"gate": {"min_failure_confidence": 0.6, "rehearse": "all"}}))
    caplog.set_level(logging.INFO, logger="envace_mcp.graph.served")
    try:
        ServedContext(model=str(tiny_qwen3_dir), adapter=str(strict)).load()
        [info] = [r for r in caplog.records if str(strict) in r.getMessage()]
        assert info.levelno == logging.INFO and info.getMessage() == (
            f"gate from the adapter's envace.json ({strict}): on_unusable=block "
            "(the context's gate overrides)")
        monkeypatch.setenv("ENVACE_MODEL", str(tiny_qwen3_dir))
        monkeypatch.setenv("ENVACE_ADAPTER", str(trusting))
        monkeypatch.setenv("ENVACE_GATE", "rehearse=writes")
        for _ in range(2):  # every run applies it; the log says it once
            gate = DeployedContext().load().gate
        assert gate == GateConfig(min_failure_confidence=0.6, rehearse="writes")  # the deployment's setting wins
        [warning] = [r for r in caplog.records if str(trusting) in r.getMessage()]
        assert warning.levelno == logging.WARNING and warning.getMessage().startswith(
            f"gate from the adapter's envace.json ({trusting}): min_failure_confidence=0.6,rehearse=all "
            "(ENVACE_GATE, then the run's context, override); min_failure_confidence=0.6 over GateConfig's "
            "default 0.0 trusts fewer predicted failures")
    finally:
        close_shared()
