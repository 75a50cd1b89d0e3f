"""HTTP to an OpenAI-compatible model server (vLLM): retries, timeouts, one client per event loop,
and every failure as a `BackendError` that says which server and what it answered."""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from envace_mcp._redact import redact
from envace_mcp.errors import BackendError

API_KEY_ENV = "VLLM_API_KEY"
"""The only variable a key is taken from: `OPENAI_API_KEY` belongs to another service, and would be
sent to whatever address the command line names."""


class ServerClient:
    """Requests to `url` (`http://host:port/v1`). A refused connection or a 502/503/504 is retried
    `retries` times, `backoff_s` apart, doubling; a timeout (`timeout_s`) or any other error status
    is a `BackendError` at once. At most `max_concurrency` requests are in flight per event loop."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 300.0, retries: int = 3,
                 backoff_s: float = 0.5, max_concurrency: int = 64) -> None:
        self.url = url
        self.shown = redact(url)
        """`url` as messages show it (credentials in it are `***`)."""
        self.api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_concurrency = max_concurrency
        self._clients: weakref.WeakKeyDictionary[Any, tuple[Any, asyncio.Semaphore]] = weakref.WeakKeyDictionary()
        """One HTTP client and limit per event loop (an httpx client belongs to the loop it starts on)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _client(self) -> tuple[Any, asyncio.Semaphore]:
        import httpx

        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            client = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout_s,
                                       limits=httpx.Limits(max_connections=self.max_concurrency))
            self._clients[loop] = (client, asyncio.Semaphore(self.max_concurrency))
        return self._clients[loop]

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        client, slots = self._client()
        delay = self.backoff_s
        async with slots:
            for attempt in range(self.retries + 1):
                try:
                    response = await client.post(path, json=body)
                except httpx.TimeoutException as exc:
                    raise BackendError(f"vLLM at {self.shown} did not answer within {self.timeout_s:g} s") from exc
                except httpx.TransportError as exc:
                    if attempt == self.retries:
                        raise BackendError(f"vLLM at {self.shown} is not reachable ({type(exc).__name__}: {exc}); "
                                           f"tried {self.retries + 1} times") from exc
                else:
                    if response.status_code not in (502, 503, 504) or attempt == self.retries:
                        return self._json(response)
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def root(self) -> str:
        """The server's own address, without the OpenAI `/v1` (where vLLM's `/pause` and `/resume` live)."""
        return self.url.removesuffix("/v1")

    def request_sync(self, method: str, path: str, body: dict[str, Any] | None = None, *, root: bool = False) -> Any:
        """One blocking request (setup: listing models, loading adapters); no retries. `root`: `path`
        is under the server's address, not under `/v1`."""
        import httpx

        try:
            response = httpx.request(method, (self.root if root else self.url) + path, json=body, headers=self.headers,
                                     timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise BackendError(f"vLLM at {self.shown} is not reachable ({type(exc).__name__}: {exc}); is the server "
                               "running (python -m vllm.entrypoints.openai.api_server …)?") from exc
        return self._json(response) if response.headers.get("content-type", "").startswith("application/json") \
            or response.status_code >= 400 else response.text

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[0].aclose()

    def _json(self, response: Any) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                detail = response.json()
                message = detail.get("error", {}).get("message") if isinstance(detail.get("error"), dict) else None
                message = message or detail.get("message") or detail.get("detail") or response.text
            except ValueError:
                message = response.text
            raise BackendError(f"vLLM at {self.shown} answered {response.status_code}: {str(message)[:500]}",
                               status=response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise BackendError(f"vLLM at {self.shown} answered with no JSON: {response.text[:200]!r}") from exc
