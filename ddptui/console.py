"""The ``ddptui`` command. A headless torchrun run's driver starts first (see
:mod:`ddptui.run.prestart`), so it imports torch while the front end loads and checks the
run; then the command line is the one of :mod:`ddptui.cli`."""

from __future__ import annotations

import sys


def main() -> int:
    from ddptui.run import prestart  # light: the standard library and ddptui.constants

    prestart.start(sys.argv[1:])
    from ddptui.cli import main as cli_main  # the front end: about 0.1 s of imports

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
