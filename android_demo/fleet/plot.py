"""The fleet run's figure: accuracy and participation per round, drawn with matplotlib.

matplotlib is an optional extra (`pip install 'sporenet[plot]'`); `require_matplotlib`
says so before a run starts, so nobody waits for a simulation to learn the plot cannot
be drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sporenet.android_demo.errors import AppError

if TYPE_CHECKING:
    from sporenet.android_demo.fleet.simulator import FleetReport

MISSING = "--plot needs matplotlib: pip install 'sporenet[plot]' (or leave out --plot)"


def require_matplotlib() -> None:
    """Raise AppError naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AppError(MISSING) from None


def write_plot(report: FleetReport, path: Path) -> None:
    """Accuracy of each round's global model (left axis) and the share of devices whose
    update reached the server (right axis), with the initial accuracy as round 0."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rounds = [r.round for r in report.rounds]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    try:
        ax.plot(
            [0, *rounds],
            [report.initial_accuracy, *[r.accuracy for r in report.rounds]],
            marker="o",
            color="tab:blue",
            label="accuracy of the global model (test split)",
        )
        ax.set_xlabel("round (0: the initial model)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        ax.set_xticks([0, *rounds] if len(rounds) <= 20 else ax.get_xticks())
        ax.grid(alpha=0.3)
        share = ax.twinx()
        share.bar(
            rounds,
            [r.trained / report.devices for r in report.rounds],
            width=0.5,
            alpha=0.25,
            color="tab:green",
            label="devices whose update arrived (share)",
        )
        share.set_ylabel("share of devices")
        share.set_ylim(0, 1.02)
        lines = ax.get_legend_handles_labels()
        bars = share.get_legend_handles_labels()
        ax.legend(
            lines[0] + bars[0],
            lines[1] + bars[1],
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=2,
            frameon=False,
            fontsize="small",
        )
        ax.set_zorder(share.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.set_title(
            f"Federated averaging on {report.devices} devices ({report.backend} backend)",
            pad=28,
        )
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
