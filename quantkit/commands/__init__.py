"""One module per CLI command; each imports heavy modules inside the command function.  The options they share."""

from collections.abc import Callable, Sequence

import click

QUIET = click.option("-q", "--quiet", is_flag=True,
                     help="No progress on stderr (otherwise a bar on a terminal, a line every 5 s in a log).")


class RegistryChoice(click.Choice):
    """A choice among the names a registry lists (e.g. the formats ``convert --to`` writes), read when the option is
    used: the registry's modules are imported then, not when the command is defined."""

    def __init__(self, names: Callable[[], Sequence[str]]) -> None:  # click.Choice.__init__ would fix the names now
        self.names, self.case_sensitive = names, True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.names())
