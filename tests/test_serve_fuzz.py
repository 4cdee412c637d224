"""Fuzzing: requests made from the service's own OpenAPI schema (schemathesis, valid and invalid ones) get no 5xx
and replies that conform to the schema; the drafter-spec parser and the served option checks (hypothesis) refuse
what they refuse with a SpecvizError, and what they take is within the spec's bounds."""
from __future__ import annotations

import math
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from serving import Running

from specviz.drafters import REGISTRY, K, parse_spec
from specviz.errors import SpecvizError
from specviz.serve.http import Limits, Service
from specviz.serve.validate import served_drafter

TOKEN = "a-long-random-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 150  # per generation mode, over every operation: about a minute on a 2-core machine
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed(tiny_models):
    service = Service({"tiny": tiny_models}, token=TOKEN, limits=Limits(max_new_tokens=8), max_queue=200,
                      max_per_client=200)
    service.scheduler.unclaimed_grace_s = 1.0  # the runs nobody listens to end soon
    with Running(service) as running:
        yield running


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_requests_from_the_schema_get_no_5xx_and_conformant_replies(fuzzed, mode):
    raw = httpx.get(fuzzed.url + "/openapi.json", headers=AUTH).json()
    schema = schemathesis.openapi.from_dict(raw)
    started, calls = time.monotonic(), []

    @given(case=schema.as_strategy(generation_mode=schemathesis.GenerationMode(mode)))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def call(case):
        response = case.call(base_url=fuzzed.url, headers=AUTH, timeout=30)
        calls.append(response.status_code)
        case.validate_response(response, checks=CHECKS)

    call()
    assert calls and max(calls) < 500 and time.monotonic() - started < 240
    print(f"\n{mode}: {len(calls)} requests, statuses {sorted(set(calls))}, {time.monotonic() - started:.0f} s")


# ------------------------------------------------------------------------------------------- drafter specs

SPECS = sorted(REGISTRY)
ODD = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e-320, 2**64, -1, "nan", "inf", "1e999", "", "１２"])


def values_of(option) -> st.SearchStrategy:
    """Values near what the option takes: in and just outside its bounds, its words, and odd ones."""
    low = -5 if option.low is None else int(option.low) - 2
    high = (low + 1000) if option.high is None else int(option.high) + 2
    plausible = {bool: st.booleans(), int: st.integers(low, high), str: st.text(max_size=8),
                 float: st.floats(low, high, allow_nan=False), object: st.text(max_size=4)}[option.type]
    return st.one_of(plausible, st.sampled_from(option.words or ("auto",)), st.booleans(), ODD)


@st.composite
def drafter_requests(draw) -> tuple[str, dict]:
    """A drafter string with options and extra options, of the drafter's own option names (and a few others)."""
    spec = REGISTRY[draw(st.sampled_from(SPECS))]
    options = {o.name: o for o in spec.options} | {"k": K}
    names = draw(st.lists(st.sampled_from(sorted(options)), max_size=3, unique=True))
    chosen = {name: draw(values_of(options[name])) for name in names}
    if draw(st.integers(0, 9)) == 0:
        chosen[draw(st.sampled_from(["head", "x", "k=1", ""]))] = draw(values_of(K))
    in_text = draw(st.lists(st.sampled_from(sorted(chosen)), unique=True)) if chosen else []
    text = ":".join([spec.name] + [f"{k}={chosen[k]}" for k in in_text])
    return text, {k: v for k, v in chosen.items() if k not in in_text}


@given(text=st.one_of(st.text(max_size=40), drafter_requests().map(lambda r: r[0])))
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
def test_the_spec_parser_takes_or_refuses_any_text_with_a_message(text):
    try:
        name, options = parse_spec(text)
    except SpecvizError:
        return
    assert isinstance(name, str) and all(isinstance(k, str) for k in options)


@given(request=drafter_requests())
@settings(max_examples=800, deadline=None, derandomize=True, database=None)
def test_what_a_client_may_set_is_served_and_within_the_spec(request):
    """What the service takes (parse_spec, then check_options with served=True, through served_drafter): only
    served options, each of its type and finite, within [low, high] or one of its words."""
    drafter, options = request
    try:
        name, merged = served_drafter(drafter, options, SPECS)
    except SpecvizError:
        return
    spec = REGISTRY[name]
    for key, value in merged.items():
        option = K if key == "k" and spec.option("k") is None else spec.option(key)
        assert option is not None and option.served, key
        if isinstance(value, str) and value in option.words:
            continue
        assert isinstance(value, option.type) or (option.type is float and isinstance(value, int)), (key, value)
        if option.type in (int, float) and not isinstance(value, bool):
            assert math.isfinite(value), (key, value)
            assert option.low is None or value >= option.low, (key, value)
            assert option.high is None or value <= option.high, (key, value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("served", [False, True])
def test_a_non_finite_number_is_refused_by_the_spec_itself(value, served):
    """Not only the service's parser: the spec's own check refuses NaN and infinities (NaN passes every < and >)."""
    with pytest.raises(SpecvizError, match="medusa option epsilon must be"):
        REGISTRY["medusa"].check({"epsilon": value}, served=served)
    REGISTRY["medusa"].check({"epsilon": 0.1}, served=served)  # a finite value in range is taken
