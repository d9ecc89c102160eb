import sys

from esr_app.cli import main

if __name__ == "__main__":  # not when a pool's child process imports this module
    sys.exit(main())
