"""The spool moved to packscope.core.spool, where `packscope sync` reads it without torch; this
name stays for the code that imports it from the agent (bench/spool_replay.py)."""

from packscope.core.spool import Entry, Spool, SpoolError, encode

__all__ = ["Entry", "Spool", "SpoolError", "encode"]
