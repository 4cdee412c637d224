"""The service backend: one model of a `specviz serve` service, streaming the same events over HTTP. The service
queues every client's runs itself."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, cast

from specviz.backends.base import Backend, Capabilities, Events, OnWait, Prompt, Run, no_options
from specviz.backends.client import Client
from specviz.errors import SpecvizError


class ServiceBackend(Backend):
    """The same events as our engine in this process, full detail; runs can have watch links. The weights are on
    the service: the bench and the bandwidth probe run there (`specviz bench` on its machine)."""

    engine = "specviz"  # our engine decodes there
    capabilities = Capabilities(watch=True, verify_cost=True)
    hooks = ("on_shared",)

    def __init__(self, url: str, row: dict[str, Any], token: str | None = None):
        self.url, self.row, self.token = url, row, token  # row: the service's /v1/models entry for the model
        self.names = [str(row["name"])]  # every model the service runs (connect fills it in)

    @classmethod
    def open(cls, address: str, model: str | None = None, token: str | None = None, **options: Any) -> ServiceBackend:
        """"http://host:port" (or https): the service's model `model` (default: its first)."""
        no_options(cls.engine, options, "the service loads its own models")
        return cls.connect(address, model=model, token=token)

    @classmethod
    def connect(cls, url: str, model: str | None = None, token: str | None = None) -> ServiceBackend:
        rows = Client(url, token=token).models()
        names = [r["name"] for r in rows]
        if model is not None and model not in names:
            raise SpecvizError(f"the service at {url} has no model {model!r}; it runs: {', '.join(names)}")
        backend = cls(url, rows[names.index(model) if model is not None else 0], token)
        backend.names = names
        return backend

    @property
    def name(self) -> str:
        return str(self.row["name"])

    @property
    def device(self) -> str:
        return str(self.row["device"])

    @property
    def dtype(self) -> str:
        return str(self.row["dtype"])

    def served(self) -> list[str]:
        return list(self.names)

    def drafters(self) -> list[str]:
        return [d for d in self.row["drafters"] if ":" not in d]

    def variants(self) -> list[str]:
        return [d for d in self.row["drafters"] if ":" in d]

    def where(self) -> str:
        return f"on the service at {self.url}, on {self.device} ({self.dtype})"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "engine": "specviz serve", "device": self.device, "dtype": self.dtype,
                "detail": self.detail, "drafters": list(self.row["drafters"]), "where": self.where()}

    def stream(self, run: Run, on_wait: OnWait | None = None, *,
               on_shared: Callable[[str], None] | None = None) -> Events:
        """The run on the service; on_wait(position) is called while it waits in the service's queue.
        on_shared: the run gets a read-only watch link, and on_shared(share_id) is called before its events."""
        if not isinstance(run.prompt, str) and any(isinstance(t, int) for t in run.prompt):
            raise SpecvizError(f"the service at {self.url} takes a text or chat messages, not token ids")
        client = Client(self.url, token=self.token, client_id=run.client_id)
        yield from client.stream(cast(Prompt, run.prompt), on_queued=on_wait, on_shared=on_shared,
                                 **parameters(run, self.name))

    def watch(self, share_id: str, on_wait: OnWait | None = None, client_id: str | None = None) -> Events:
        """Another client's shared run, read-only: every event from its first, however late this viewer comes."""
        yield from Client(self.url, token=self.token, client_id=client_id).watch(share_id, on_queued=on_wait)


def parameters(run: Run, model: str) -> dict[str, Any]:
    """The service's POST /v1/runs body for `run`, less its prompt (Client.start adds it): the drafter's name and
    options apart, as the run parsed them, so that the service parses no drafter string again. `model`: the
    service's model where the run names none."""
    chosen = {"drafter": run.drafter} if run.drafter is not None else {}  # else the service's default
    return {"model": run.model or model, **chosen, "drafter_options": dict(run.drafter_options), "chat": run.chat,
            "detail": run.detail, **asdict(run.settings)}
