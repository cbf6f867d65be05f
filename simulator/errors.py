"""One exception type for every problem a user can fix: bad scenario, unknown topology, bad overrides."""


class ScenarioError(Exception):
    """A user-facing error: the message names the field and the reason. The CLI prints it and exits 2."""
