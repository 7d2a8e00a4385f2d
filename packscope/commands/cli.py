"""The `packscope` command. Subcommands import their dependencies lazily, so that `flops` and
`train` work with the agent's dependencies alone and `serve` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# subcommand -> (the function adding its options, the function running it, help), as
# "module:function". Only the chosen subcommand's modules are imported (serve must not pull in
# torch, for one), and its runner only once the arguments parsed, so that `packscope train --help`
# and a mistyped option answer without loading torch.
COMMANDS = {
    "serve": (
        "packscope.commands.serve:add_serve_arguments",
        "packscope.commands.serve:serve_from_args",
        "run the dashboard and ingest server",
    ),
    "train": (
        "packscope.trainer.config:add_train_arguments",
        "packscope.trainer.train:train_from_args",
        "run the reference trainer with the agent wired in",
    ),
    "demo": (
        "packscope.commands.demo:add_demo_arguments",
        "packscope.commands.demo:demo_from_args",
        "start a server and feed it two reference runs (BSHD and THD)",
    ),
    "import": (
        "packscope.commands.importer:add_import_arguments",
        "packscope.commands.importer:import_from_args",
        "send run files (train --records-dir, the gallery) to a server",
    ),
    "sync": (
        "packscope.commands.sync:add_sync_arguments",
        "packscope.commands.sync:sync_from_args",
        "send what runs left on disk (spools, offline runs, run files) to a server, exactly once",
    ),
    "export": (
        "packscope.commands.export:add_export_arguments",
        "packscope.commands.export:export_from_args",
        "download a run's intervals as CSV",
    ),
    "diagnose": (
        "packscope.commands.diagnose:add_diagnose_arguments",
        "packscope.commands.diagnose:diagnose_from_args",
        "where a run's step time went: the loss ledger as a table",
    ),
    "alerts": (
        "packscope.commands.alerts:add_alerts_arguments",
        "packscope.commands.alerts:alerts_from_args",
        "the server's open alerts (stalled, crashed, slowdown, straggler, ...) as a table",
    ),
    "flops": (
        "packscope.commands.flops:add_flops_arguments",
        "packscope.commands.flops:flops_from_args",
        "FLOPs of packs of documents for a Hugging Face model",
    ),
}


def load(reference: str) -> Any:
    """The object a "module:function" reference names."""
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen in COMMANDS:
        add, run, help_text = COMMANDS[chosen]
        parser = argparse.ArgumentParser(prog=f"packscope {chosen}", description=help_text)
        load(add)(parser)
        rest = list(argv)
        rest.remove(chosen)
        args = parser.parse_args(rest)
        return int(load(run)(args) or 0)
    parser = argparse.ArgumentParser(
        prog="packscope",
        description="How fast is this training run, really?",
        epilog="commands:\n" + "\n".join(f"  {k:<10}{v[2]}" for k, v in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    parser.parse_args(argv[:1])  # prints usage or --help, exits 2 or 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
