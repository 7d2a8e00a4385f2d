"""The `packscope` command. Subcommands import their dependencies lazily, so that `flops` and
`train` work with the agent's dependencies alone and `serve` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, add-arguments function, run function, help)
COMMANDS = {
    "serve": ("packscope.backend.cli", "add_serve_arguments", "serve_from_args", "run the dashboard and ingest server"),
    "train": ("packscope.trainer.train", "add_train_arguments", "train_from_args", "run the reference trainer with the agent wired in"),
    "demo": ("packscope.demo", "add_demo_arguments", "demo_from_args", "start a server and feed it two reference runs (BSHD and THD)"),
    "export": ("packscope.backend.cli", "add_export_arguments", "export_from_args", "download a run's intervals as CSV"),
    "flops": ("packscope.flops_cmd", "add_flops_arguments", "flops_from_args", "FLOPs of packs of documents for a Hugging Face model"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Import only the chosen subcommand's module (serve must not pull in torch, for one).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen in COMMANDS:
        module, add, run, help_text = COMMANDS[chosen]
        parser = argparse.ArgumentParser(prog=f"packscope {chosen}", description=help_text)
        mod = importlib.import_module(module)
        getattr(mod, add)(parser)
        rest = list(argv)
        rest.remove(chosen)
        args = parser.parse_args(rest)
        return int(getattr(mod, run)(args) or 0)
    parser = argparse.ArgumentParser(
        prog="packscope",
        description="How fast is this training run, really?",
        epilog="commands:\n" + "\n".join(f"  {k:<8}{v[3]}" for k, v in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    parser.parse_args(argv[:1])  # prints usage or --help, exits 2 or 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
