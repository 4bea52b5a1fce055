"""The `parley` command line: the entry point, the engine options its subcommands share, generate, chat and serve."""
