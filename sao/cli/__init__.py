"""The ``sao`` command line. Every subcommand imports its implementation lazily so ``sao --help`` is instant."""
