"""``python -m clients.cli``: the ``placectl`` command line."""

from clients.cli import main

if __name__ == "__main__":
    main()
