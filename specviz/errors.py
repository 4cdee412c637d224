"""The one exception type a user of specviz sees for mistakes they can fix."""


class SpecvizError(Exception):
    """Bad input, a missing or corrupt model file, an unsupported model: a message meant for the user."""
