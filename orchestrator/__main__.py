# Ctrl-C while Python loads the command line and its verbs: held until they are loaded
# (a KeyboardInterrupt raised inside the import machinery's own callbacks is printed by
# Python as "Exception ignored ..." with a traceback), then one line and exit 130. The
# first statement is the try: a Ctrl-C during `import signal` itself (the enum it builds
# takes milliseconds on a loaded host) is an interruption too.
_held: list[int] = []
try:
    import signal

    _default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if _default:
        signal.signal(signal.SIGINT, lambda signum, frame: _held.append(signum))
    try:
        from .cli import main
    finally:
        if _default:
            signal.signal(signal.SIGINT, signal.default_int_handler)
except KeyboardInterrupt:   # before the hold was set, or Ctrl-C's default was not ours
    _held.append(2)

import sys  # noqa: E402 (loaded at start-up, before any module of ours)

if _held:
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
