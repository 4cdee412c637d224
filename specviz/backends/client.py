"""The Python client of `specviz serve`: the same event objects `specviz.stream` yields, from a remote engine.

    client = specviz.Client("http://gpu-box:8000", token="...")
    for event in client.stream("Explain KV caches.", drafter="eagle2", max_new_tokens=64):
        ...

A dropped connection is resumed with Last-Event-ID (every event arrives once); a service whose connections are all
busy (503) is asked again after its Retry-After (at most 10 s, `retries` times); closing the iterator early
cancels the run, so the remote device is free again within one step."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterator

import httpx

from specviz.backends.base import Events, Prompt
from specviz.decoding import events as ev
from specviz.errors import SpecvizError

TOKEN_ENV = "SPECVIZ_BACKEND_TOKEN"


class Client:
    def __init__(self, url: str, token: str | None = None, client_id: str | None = None, timeout_s: float = 30.0,
                 retries: int = 3):
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        if client_id:
            self.headers["X-Specviz-Client"] = client_id  # one app serving many viewers names each of them
        self.timeout = httpx.Timeout(timeout_s, read=None)  # a stream may wait long in the queue
        self.retries = retries

    # --------------------------------------------------------------------------------------- requests

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                response = httpx.request(method, self.url + path, headers=self.headers, timeout=self.timeout, **kwargs)
            except httpx.HTTPError as err:
                raise SpecvizError(f"cannot reach the specviz service at {self.url}: {err}") from err
            wait = _busy_for(response)
            if wait is None or attempt == self.retries:
                break
            time.sleep(wait)
        if response.status_code >= 400:
            raise SpecvizError(f"the service refused the request ({response.status_code}): {_message(response)}")
        body: dict[str, Any] = response.json()
        return body

    def models(self) -> list[dict[str, Any]]:
        """What the service loaded: name, device, dtype, drafters, verify-cost curve."""
        rows: list[dict[str, Any]] = self._request("GET", "/v1/models")["models"]
        return rows

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def submit(self, prompt: Prompt, **parameters: Any) -> str:
        """POST /v1/runs; returns the run id. parameters: those of specviz.stream that the service takes."""
        return str(self.start(prompt, **parameters)["run_id"])

    def start(self, prompt: Prompt, **parameters: Any) -> dict[str, Any]:
        """POST /v1/runs: {"run_id", "position", "share_id"} (share=True gives the run a read-only watch link)."""
        body = {"messages" if isinstance(prompt, list) else "prompt": prompt, **parameters}
        return self._request("POST", "/v1/runs", json=body)

    def cancel(self, run_id: str) -> None:
        try:
            httpx.delete(f"{self.url}/v1/runs/{run_id}", headers=self.headers, timeout=5.0)
        except httpx.HTTPError:
            pass  # the service is gone: nothing left to cancel

    # --------------------------------------------------------------------------------------- streams

    def events(self, run_id: str, on_queued: Callable[[int], None] | None = None) -> Iterator[dict[str, Any]]:
        """The run's events as dicts, in order and each once, resuming after a dropped connection."""
        return self._follow(f"/v1/runs/{run_id}/events", on_queued)

    def watch(self, share_id: str, on_queued: Callable[[int], None] | None = None) -> Events:
        """A shared run's events, read-only, from its first (however late this viewer comes) to its last."""
        got_done = False
        for data in self._follow(f"/v1/watch/{share_id}/events", on_queued):
            got_done |= data["type"] == "done"
            yield ev.from_dict(data)
        if not got_done:
            raise SpecvizError(f"the service at {self.url} ended the shared run's stream before its last event")

    def _follow(self, path: str, on_queued: Callable[[int], None] | None) -> Iterator[dict[str, Any]]:
        seen, failures = -1, 0
        while True:
            headers = dict(self.headers)
            if seen >= 0:
                headers["Last-Event-ID"] = str(seen)
            try:
                with httpx.stream("GET", self.url + path, headers=headers,
                                  timeout=self.timeout) as response:
                    wait = _busy_for(response)
                    if wait is not None and failures < self.retries:  # every connection busy: come back
                        failures += 1
                        time.sleep(wait)
                        continue
                    if response.status_code >= 400:
                        response.read()
                        raise SpecvizError(f"the service refused the stream ({response.status_code}): "
                                           f"{_message(response)}")
                    for kind, event_id, data in _sse(response.iter_lines()):
                        failures = 0
                        if kind == "queued":
                            if on_queued is not None:
                                on_queued(data["position"])
                        elif kind == "error":
                            raise SpecvizError(f"the run failed on the service: {data['error']}")
                        elif kind == "cancelled":
                            raise SpecvizError("the run was cancelled on the service")
                        elif event_id is not None and event_id > seen:
                            seen = event_id
                            yield data
                            if data["type"] == "done":
                                return
                    return  # the stream ended without a done event: the service stopped
            except (httpx.TransportError, httpx.RemoteProtocolError) as err:
                failures += 1
                if failures > self.retries:
                    raise SpecvizError(f"lost the stream from {self.url} after {seen + 1} events: {err}") from err
                time.sleep(0.2 * failures)

    def stream(self, prompt: Prompt, on_queued: Callable[[int], None] | None = None,
               on_shared: Callable[[str], None] | None = None, **parameters: Any) -> Events:
        """Like specviz.stream: a Start event, one Step per target forward, a Done event (as objects).
        on_shared: the run is shared, and on_shared(share_id) is called before its events (Client.watch and the
        app's ?watch= link follow it)."""
        started = self.start(prompt, **parameters, **({"share": True} if on_shared is not None else {}))
        run_id = started["run_id"]
        if on_shared is not None:
            on_shared(started["share_id"])
        finished = False
        try:
            got_done = False
            for data in self.events(run_id, on_queued):
                got_done |= data["type"] == "done"
                yield ev.from_dict(data)
            finished = True
            if not got_done:
                raise SpecvizError(f"the service at {self.url} ended the run's stream before its last event")
        finally:
            if not finished:
                self.cancel(run_id)  # closed early or failed: free the remote device


BUSY_WAIT_MAX_S = 10.0  # the longest a Retry-After is honoured before the next try


def _busy_for(response: httpx.Response) -> float | None:
    """Seconds to wait before trying again where the service had no connection free (503: it read nothing of the
    request, so sending it again is safe), else None."""
    if response.status_code != 503:
        return None
    try:
        return min(BUSY_WAIT_MAX_S, max(0.0, float(response.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, int | None, dict[str, Any]]]:
    """(event type, id, parsed data) for each Server-Sent Event; comments (keep-alives) are skipped."""
    kind, event_id, data = "message", None, []  # type: tuple[str, int | None, list[str]]
    for line in lines:
        if not line:
            if data:
                yield kind, event_id, json.loads("\n".join(data))
            kind, event_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                kind = value
            elif field == "id":
                event_id = int(value)
            elif field == "data":
                data.append(value)
