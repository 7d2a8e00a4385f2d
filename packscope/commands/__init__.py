"""The `packscope` command and its subcommands, one module each: the floor above everything they
call (core, agent, trainer, backend), which nothing below imports."""
