"""What traces keep of secrets: no credentials from a model's address, files only their owner reads."""

from __future__ import annotations

import os
import stat

import pytest

from envace_mcp._redact import redact
from envace_mcp.traces import Trace, TraceStore

ADDRESS = "vllm:http://alice:hunter2@10.0.0.7:8000/v1?api_key=sk-live-123&lora=x"


@pytest.mark.parametrize(("text", "shown"), [
    ("http://user:pass@host:8000/v1", "http://***@host:8000/v1"),
    ("https://token@host/v1", "https://***@host/v1"),
    (ADDRESS, "vllm:http://***@10.0.0.7:8000/v1?api_key=***&lora=x"),
    ("see http://h/p?access_token=zz&page=2#top", "see http://h/p?access_token=***&page=2#top"),
    ("http://h/s3?X-Amz-Signature=abc&design=1", "http://h/s3?X-Amz-Signature=***&design=1"),
    ("Qwen/Qwen3-0.6B (vLLM at http://127.0.0.1:8000/v1)", "Qwen/Qwen3-0.6B (vLLM at http://127.0.0.1:8000/v1)"),
    ("mailto-like user@host and a/b@c paths", "mailto-like user@host and a/b@c paths"),
])
def test_credentials_in_addresses_are_redacted_and_other_text_is_kept(text, shown):
    assert redact(text) == shown


def test_a_trace_file_holds_no_credential_from_the_models_address_or_an_error_quoting_it(tmp_path):
    store = TraceStore(tmp_path / "traces")
    trace = Trace(run_id="r1", started_at=0.0, model=f"smollm2 (vLLM at {ADDRESS[5:]})")
    trace.error = f"BackendError: vLLM at {ADDRESS[5:]} answered 500"  # set after validation, as the recorder does
    store.append(trace)
    text = store.path.read_text()
    assert "hunter2" not in text and "sk-live-123" not in text and "alice" not in text
    (back,) = store.read()
    assert back.model == "smollm2 (vLLM at http://***@10.0.0.7:8000/v1?api_key=***&lora=x)"


def test_evaluation_files_name_a_model_address_without_its_credentials():
    from envace_mcp.eval.evaluate import EvalConfig, _settings_key, _shown

    settings = EvalConfig(suite="bank", model=ADDRESS)
    for shown in (settings.label(), str(_settings_key(settings)), str(_shown(settings))):
        assert "hunter2" not in shown and "sk-live-123" not in shown


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_trace_files_and_folders_are_created_owner_only(tmp_path, umask_022):
    store = TraceStore(tmp_path / "new" / "traces")
    store.append(Trace(run_id="r1", started_at=0.0))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_a_store_made_with_a_wider_mode_shares_its_files(tmp_path, umask_022):
    store = TraceStore(tmp_path / "shared", mode=0o644)
    store.append(Trace(run_id="r1", started_at=0.0))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o644
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o755


def test_a_link_planted_as_the_trace_file_is_refused_and_its_target_left_untouched(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("mine\n")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "traces.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        TraceStore(tmp_path / "traces").append(Trace(run_id="r1", started_at=0.0))
    assert target.read_text() == "mine\n"
