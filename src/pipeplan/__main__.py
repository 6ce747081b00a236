import sys

if __name__ == "__main__":  # guarded: the runtime's spawned workers re-import this module
    try:
        from .cli import main
    except KeyboardInterrupt:  # Ctrl-C while importing: the same one line as later
        print("pipeplan: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
