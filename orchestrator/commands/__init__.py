"""The subcommands: each module adds its parser to `cli` and turns the parsed flags into typed calls.

The argparse Namespace stops here: below the commands, functions take typed options.
"""
