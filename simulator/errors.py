"""One exception type for every problem a user can fix: bad scenario, unknown topology, bad overrides."""


class ScenarioError(Exception):
    """A user-facing error: the message names the field and the reason. The CLI prints it and exits 2."""


class NothingFits(ScenarioError):
    """A plan that is valid but finds no layout to run (none valid, none fitting in memory): the CLI exits 3, so
    that a script tells it from a mistyped option (2)."""

    exit_code = 3
