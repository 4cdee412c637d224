"""specviz: speculative decoding you can watch. The library never imports streamlit."""
from specviz.api import generate, loaded, stream
from specviz.engine import Result
from specviz import events
from specviz.errors import SpecvizError

__all__ = ["generate", "stream", "loaded", "Result", "SpecvizError", "events"]
