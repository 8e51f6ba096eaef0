"""The support matrix as a heatmap PNG (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusedattn_select.cli.matrix_data import Matrix
from fusedattn_select.errors import ConfigError

PLOT_EXTRA_HINT = "needs matplotlib: pip install 'fusedattn-select[plot]'"


def require_matplotlib(path: str) -> None:
    """Raise ConfigError naming --png when its path does not end in .png, or when matplotlib cannot
    be imported (checked before any work)."""
    if Path(path).suffix.lower() != ".png" or not Path(path).stem:
        raise ConfigError("--png", path, "must be a file name ending in .png (the heatmap is a PNG image)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--png", path, PLOT_EXTRA_HINT) from None


def _label(values: tuple[str, ...]) -> str:
    return " ".join(values)


def write_heatmap(matrix: Matrix, path: str | Path, title: str) -> Path:
    """Cells coloured by accepted/answered (grey: no verdict), annotated with their counts; a PNG
    written at `path` exactly (require_matplotlib checked it ends in .png)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    rows, columns = matrix.rows, matrix.columns
    values = np.full((len(rows), len(columns)), np.nan)
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            cell = matrix.cell(row, column)
            fraction = cell.fraction() if cell is not None else None
            if fraction is not None:
                values[i, j] = fraction
    width = 2.0 + 1.3 * len(columns)
    height = 1.6 + 0.32 * len(rows)
    fig, ax = plt.subplots(figsize=(max(width, 7.0), max(height, 3.0)))
    cmap: Any = matplotlib.colormaps["RdYlGn"].with_extremes(bad="white")  # white: no problem here
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            cell = matrix.cell(row, column)
            if cell is None:
                continue
            if cell.fraction() is None:  # problems here, none with a verdict: no data, not a rejection
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d9d9d9", hatch="//",
                                       edgecolor="#9a9a9a", linewidth=0))
            ax.text(j, i, cell.text(), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(columns)), [_label(c) for c in columns], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
    ax.set_xlabel(" / ".join(matrix.column_axes))
    ax.set_ylabel(" / ".join(matrix.row_axes))
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="accepted / answered (hatched grey: no data)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as err:
        raise ConfigError("--png", str(path), f"cannot be written ({err.strerror or err})") from None
    finally:
        plt.close(fig)
    return Path(path)
