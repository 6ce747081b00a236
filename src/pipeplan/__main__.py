import sys

from .cli import main

if __name__ == "__main__":  # guarded: the runtime's spawned workers re-import this module
    sys.exit(main())
