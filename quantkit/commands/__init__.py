"""One module per CLI command; each imports heavy modules inside the command function.  The options they share."""

import click

QUIET = click.option("-q", "--quiet", is_flag=True,
                     help="No progress on stderr (otherwise a bar on a terminal, a line every 5 s in a log).")
