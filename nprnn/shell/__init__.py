"""The click building blocks of cli.py that are not commands: the options, their types and the
checks of what they say together (options.py), and how a command prints and writes what nprnn
returns (output.py). Only cli.py imports this package; it may import anything of nprnn below.
"""
