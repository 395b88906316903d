"""`brain COMMAND ...`: which command runs.  Without a command brain
serves, like `etcd`.  Each command's module is imported only when it runs,
and serve's only once its flags parsed, so `brain snapshot status` and
`brain --version` do not load the server (a second and more)."""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

# command -> the module whose main(argv) runs it
COMMAND_MODULES = {
    "snapshot": "brain.cli.snapshot",
    "import": "brain.cli.import_etcd",
    "mirror": "brain.cli.mirror",
    "groups": "brain.cli.groups",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMAND_MODULES:
        return importlib.import_module(COMMAND_MODULES[argv[0]]).main(argv[1:])
    from brain.cli import serve_args

    cfg = serve_args.parse_serve(argv)
    from brain import logging_setup
    from brain.cli import serve

    logging_setup.configure(cfg.log_level, cfg.log_format)
    return serve.run(cfg)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
