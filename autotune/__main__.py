import sys

from autotune.cli import main

if __name__ == "__main__":  # not when a trial's child process imports the main module again
    sys.exit(main())
