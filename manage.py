#!/usr/bin/env python
"""Django's command-line utility for Notify Queue (the `notifyqueue` console script is the same)."""

from notifyqueue.cli import main

if __name__ == "__main__":
    main()
