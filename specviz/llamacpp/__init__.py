"""llama.cpp's llama-server beside our engine: built for this CPU (build.py, `make llamacpp`), started and stopped
(server.py), fed our drafters as GGUF files (export.py, files.py), and its commands (`specviz llamacpp build|serve`,
cli.py). The backend that talks to a running server is specviz/backends/llamacpp.py."""
