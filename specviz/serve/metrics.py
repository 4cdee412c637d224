"""The service's Prometheus metrics. The speculative-decoding counters mirror vLLM's names
(`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`) under the `specviz:` prefix, so dashboards built for vLLM read them with
the prefix changed; queue length and the run and queue-wait latencies are specviz's own."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)  # seconds


class ServiceMetrics:
    """One registry per service (tests start several in one process)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("specviz:spec_decode_num_drafts", "Steps that drafted at least one token", registry=r)
        self.draft_tokens = Counter("specviz:spec_decode_num_draft_tokens", "Drafted tokens (tree nodes)", registry=r)
        self.accepted_tokens = Counter("specviz:spec_decode_num_accepted_tokens",
                                       "Drafted tokens accepted and committed", registry=r)
        self.accepted_per_pos = Counter("specviz:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens by depth in the draft (0 = first drafted token)",
                                        ["position"], registry=r)
        self.generated_tokens = Counter("specviz:generation_tokens", "Tokens committed (accepted, replacement, "
                                        "bonus and autoregressive)", registry=r)
        self.runs = Counter("specviz:runs", "Finished runs", ["model", "drafter"], registry=r)
        self.queue_length = Gauge("specviz:num_requests_waiting", "Runs waiting for an engine worker", registry=r)
        self.run_latency = Histogram("specviz:run_latency_seconds", "From a run's start on a worker to its end",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("specviz:queue_wait_seconds", "From a run's submission to its start",
                                    buckets=LATENCY_BUCKETS, registry=r)

    def observe_step(self, step: dict) -> None:
        if step["nodes"]:
            self.drafts.inc()
            self.draft_tokens.inc(len(step["nodes"]))
        accepted = sum(c["kind"] == "accepted" for c in step["committed"])
        self.accepted_tokens.inc(accepted)
        for position in range(accepted):
            self.accepted_per_pos.labels(position=str(position)).inc()
        self.generated_tokens.inc(len(step["committed"]))

    def observe_done(self, model: str, drafter: str, done: dict) -> None:
        # the drafter's name without its options: a label per option value would grow without bound
        self.runs.labels(model=model, drafter=drafter.split(":", 1)[0].strip()).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
