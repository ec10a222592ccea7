"""``python -m scheduler.cli``: the ``snugfit`` command without its console script."""

from scheduler.cli import main

main()
