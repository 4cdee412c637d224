"""The engine as a service: `specviz serve` loads its models once, owns the device with one engine worker per
device, and streams every run's events to any number of clients (the app's remote backend, `specviz.Client`,
an OpenAI client, the viewers of a watch link).

    http.py         the routes                          runs.py         the queue, the workers, runs' lifetimes
    validate.py     request bodies and their checks     streaming.py    SSE, traces, chat completions
    guard.py        Host allow-list, body limit, token, the error shape
    connections.py  the connection cap and the header deadline (uvicorn's h11, guarded)
    metrics.py      the Prometheus counters             cli.py          `specviz serve` and `specviz load-bench`

Its Python client is specviz/backends/client.py, beside the backend that decodes through it.

docs/service.md is the reference."""
