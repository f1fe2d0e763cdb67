"""``python -m quantkit``: the same CLI as the ``quantkit`` command."""

from .cli import main

main()
