import sys

if __name__ == "__main__":  # guarded: the runtime's spawned workers re-import this module
    try:
        from .cli.app import main
    except (KeyboardInterrupt, ImportError) as e:  # Ctrl-C while importing: the same one line as later
        if isinstance(e, ImportError) and not isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            raise
        from .errors import interrupted

        print(interrupted(None, "Ctrl-C"), file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
