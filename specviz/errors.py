"""The one exception type a user of specviz sees for mistakes they can fix, and how its messages quote what was sent."""


class SpecvizError(Exception):
    """Bad input, a missing or corrupt model file, an unsupported model: a message meant for the user."""


ECHO_CHARS = 60  # the most of a client's value an error message repeats


def shown(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value as an error message may repeat it: its repr (lone surrogates and control characters
    escaped), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"
