"""nprnn's command line: a thin click group that parses options, calls into `nprnn`, and prints.

    python cli.py params                  parameter counts at the paper's configurations
    python cli.py bench --model antisym   forward / forward+backward timings (see README)
    python cli.py --help                  everything else
"""
import click

import nprnn


@click.group(context_settings=dict(help_option_names=["-h", "--help"]))
def cli():
    """AntisymmetricRNN and its baselines in NumPy + Numba (Chang et al., ICLR 2019)."""


# ----------------------------------------------------------------------------------------------
# params: Table 1 and Table 2's "# params" column
# ----------------------------------------------------------------------------------------------

# (table, model, hidden units, input size m, the paper's "# params")
PAPER_CONFIGS = [
    ("Table 1 (MNIST)", "lstm", 128, 1, "68k"),
    ("Table 1 (MNIST)", "antisym", 128, 1, "10k"),
    ("Table 1 (MNIST)", "antisym-gated", 128, 1, "10k"),
    ("Table 2 (CIFAR-10)", "lstm", 128, 3, "69k"),
    ("Table 2 (CIFAR-10)", "ablation", 196, 3, "42k"),
    ("Table 2 (CIFAR-10)", "antisym", 256, 3, "36k"),
    ("Table 2 (CIFAR-10)", "antisym-gated", 256, 3, "37k"),
]


@cli.command()
@click.option("--classes", "K", default=10, show_default=True, help="Readout classes K.")
def params(K):
    """Parameter count of each model at the paper's configurations, beside the paper's column.

    Counts include the readout (W_out, b_out); W of the antisymmetric models counts n(n-1)/2."""
    click.echo(f"{'table':<20} {'model':<15} {'units':>5} {'m':>3} {'ours':>8} {'paper':>6}")
    for table, name, n, m, paper in PAPER_CONFIGS:
        count = nprnn.CELLS[name].num_params(m, n) + K * n + K
        click.echo(f"{table:<20} {name:<15} {n:>5} {m:>3} {count:>8,} {paper:>6}")
    click.echo("\nAll models at n=128, m=1:")
    for name, cell in nprnn.CELLS.items():
        click.echo(f"  {name:<15} {cell.num_params(1, 128) + K * 128 + K:>8,}  {cell.summary}")


if __name__ == "__main__":
    cli()
