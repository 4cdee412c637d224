"""JSON Schema checks with each schema's validator built once: `jsonschema.validate` checks the schema itself and
builds a validator on every call (about 60 ms for the event schema, against 0.4 ms for the check alone)."""
from __future__ import annotations

from typing import Any

_VALIDATORS: dict[int, tuple[dict, Any]] = {}  # id(schema) -> (the schema, kept alive with its id; its validator)


def check(document: Any, schema: dict) -> None:
    """Raise jsonschema.ValidationError, the same error jsonschema.validate would, when `document` does not follow
    `schema` (a module-level schema: it is not copied, so it must not change after its first check)."""
    import jsonschema

    held = _VALIDATORS.get(id(schema))
    if held is None or held[0] is not schema:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        held = _VALIDATORS[id(schema)] = (schema, cls(schema))
    error = jsonschema.exceptions.best_match(held[1].iter_errors(document))
    if error is not None:
        raise error
