"""specviz: speculative decoding you can watch. The library never imports streamlit."""
from specviz.api import generate, loaded, stream
from specviz.decoding import events
from specviz.decoding.engine import Result
from specviz.errors import SpecvizError

__all__ = ["Client", "generate", "stream", "loaded", "Result", "SpecvizError", "events"]


def __getattr__(name: str):
    if name == "Client":  # the service's client: imports httpx only when asked for
        from specviz.backends.client import Client

        return Client
    raise AttributeError(f"module 'specviz' has no attribute {name!r}")
