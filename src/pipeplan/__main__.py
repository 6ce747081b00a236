import sys

if __name__ == "__main__":  # guarded: the runtime's spawned workers re-import this module
    try:
        from .cli.app import main
    except (KeyboardInterrupt, ImportError, RuntimeError) as e:  # Ctrl-C while importing: the same line as later
        from .errors import from_ctrl_c, interrupted

        if not from_ctrl_c(e):
            raise

        print(interrupted(None, "Ctrl-C"), file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
