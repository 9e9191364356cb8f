"""Subcommands of the ``perfguard`` CLI beyond ``analyze``, one module each.

Each module has ``add_parser(subparsers)``; :data:`perfguard.cli.COMMAND_MODULES`
lists them. They are thin: parse arguments, call the library, print.
"""
