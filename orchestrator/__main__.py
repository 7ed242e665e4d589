import sys

try:
    from .cli import main
except KeyboardInterrupt:   # Ctrl-C while Python loads the command line
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
