"""The engine as a service: `specviz serve` loads its models once, owns the device with one engine worker per
device, and streams every run's events to any number of clients (the app's remote backend, `specviz.Client`,
an OpenAI client). runs.py is the queue and the workers, http.py the routes, client.py the Python client,
metrics.py the Prometheus counters. docs/service.md is the reference."""
