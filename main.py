"""Paxloom's command, run from a clone: the same as the installed `paxloom` command.

    python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4 --job_log_dir=runs/x

`python main.py --help` lists the flags; the entry point itself is paxloom/main.py.
"""

from paxloom.main import cli

if __name__ == "__main__":
    cli()
