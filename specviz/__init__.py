"""specviz: speculative decoding you can watch. The library never imports streamlit."""
from specviz.api import generate, loaded, stream
from specviz.decoding import events
from specviz.decoding.engine import Result
from specviz.errors import SpecvizError

__all__ = ["generate", "stream", "loaded", "Result", "SpecvizError", "events"]
