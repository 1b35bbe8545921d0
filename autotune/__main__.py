import sys

try:
    from autotune.cli import main
except KeyboardInterrupt:  # Ctrl-C in the first instants: one line, as main says it later
    print("\nautotune: interrupted (SIGINT)", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":  # not when a trial's child process imports the main module again
    sys.exit(main())
