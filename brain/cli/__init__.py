"""brain's commands: `brain [serve]`, `brain snapshot`, `brain import`,
`brain mirror`, `brain groups` (brain.cli.commands dispatches; one module
per command).

Above every other package: a command wires the engine, the cluster, the
API servers and metrics together; nothing below imports brain.cli.
"""

from brain.cli.commands import main

__all__ = ["main"]
