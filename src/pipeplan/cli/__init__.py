"""The command line: parsing and printing only (``app``: the parser and the pipeline commands;
``dynamic``, ``shard``: their command families; ``report``, ``progress``: what is printed)."""

from .app import build_parser, main

__all__ = ["build_parser", "main"]
