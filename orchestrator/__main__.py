import signal
import sys

# Ctrl-C while Python loads the command line and its verbs: held until they are loaded
# (a KeyboardInterrupt raised inside the import machinery's own callbacks is printed by
# Python as "Exception ignored ..." with a traceback), then one line and exit 130.
_held: list[int] = []
_default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
if _default:
    signal.signal(signal.SIGINT, lambda signum, frame: _held.append(signum))
try:
    from .cli import main
except KeyboardInterrupt:   # Ctrl-C's default was not ours to hold (an embedding's)
    _held.append(signal.SIGINT)
finally:
    if _default:
        signal.signal(signal.SIGINT, signal.default_int_handler)
if _held:
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
