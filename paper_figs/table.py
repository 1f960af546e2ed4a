"""Figure inputs: results tables only (a figure never runs an experiment), checked for the columns it needs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


class FigureError(ValueError):
    """A figure cannot be drawn from the tables it was given; the message says which table and what is missing."""


def load_table(results_dir: str | Path, table: str, columns: tuple[str, ...], figure: str,
               rerun_hint: str = "") -> pd.DataFrame:
    path = Path(results_dir) / f"{table}.parquet"
    if not path.is_file():
        raise FigureError(f"figure {figure}: no results table {path}" + (f"; make it with {rerun_hint}" if rerun_hint
                                                                          else ""))
    frame = pd.read_parquet(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise FigureError(f"figure {figure}: {path} lacks column(s) {', '.join(missing)}"
                          + (f"; re-run {rerun_hint}" if rerun_hint else ""))
    if frame.empty:
        raise FigureError(f"figure {figure}: {path} has no rows")
    return frame


def where(frame: pd.DataFrame, **equal) -> pd.DataFrame:
    """Rows whose columns equal the given values (keys use __ for dots: split__mode='offload')."""
    mask = pd.Series(True, index=frame.index)
    for key, value in equal.items():
        col = key.replace("__", ".")
        mask &= frame[col].isna() if value is None else frame[col] == value
    return frame[mask]


def unique_points(frame: pd.DataFrame, keys: list[str], figure: str) -> pd.DataFrame:
    """One row per point; several rows for one point mean a config column the figure does not show varied."""
    dup = frame.duplicated(subset=keys, keep=False)
    if dup.any():
        rows = frame[dup]
        varying = [c for c in rows.columns if c not in keys and not c.endswith(("_s", "_at", "hash"))
                   and rows.groupby(keys, dropna=False)[c].nunique(dropna=False).gt(1).any()]
        raise FigureError(f"figure {figure}: several runs per point of ({', '.join(keys)}); they differ in "
                          f"{', '.join(varying) or 'nothing shown'} - point results.dir at one sweep")
    return frame


def preset_filter(entry: str, preset: str, overrides: dict | None = None) -> dict:
    """Config columns a preset fixes (everything it does not sweep), as {column: value}; overrides replace some.

    A figure keeps only the rows its preset made, so other runs in the same results dir never leak into it.
    """
    import importlib

    from freetoken.experiments.compose import compose
    from freetoken.experiments.runner import UNHASHED, config_columns

    module = importlib.import_module(f"freetoken.experiments.{entry}")
    cfg = compose([f"experiment={preset}"], hydra_config=True)
    swept = [str(k) for k in cfg.hydra.sweeper.params]
    groups = module.groups(cfg) if hasattr(module, "groups") else module.GROUPS
    columns = config_columns(cfg, groups)
    if hasattr(module, "columns_filter"):
        columns = module.columns_filter(columns)
    fixed = {k: v for k, v in columns.items()
             if k not in UNHASHED and not any(k == s or k.startswith(s + ".") for s in swept)}
    fixed.update(overrides or {})
    return fixed


def preset_rows(frame: pd.DataFrame, fixed: dict, figure: str, table_path: Path, hint: str) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for col, value in fixed.items():
        if col not in frame.columns:
            if value is None:
                continue
            mask &= False
            continue
        mask &= frame[col].isna() if value is None else frame[col] == value
    rows = frame[mask]
    if rows.empty:
        near = {c: sorted(frame[c].dropna().unique().tolist())[:4] for c, v in fixed.items()
                if c in frame.columns and v is not None and not (frame[c] == v).any()}
        raise FigureError(f"figure {figure}: no rows of its preset in {table_path} (first mismatches: "
                          f"{dict(list(near.items())[:3])}); make them with {hint}")
    return rows


def figure_rows(results_dir: str | Path, fig, overrides: dict | None = None) -> pd.DataFrame:
    """The rows of fig's results table made by fig's preset (fig: a figure module with NAME, TABLE, COLUMNS,
    ENTRY, PRESET, HINT); overrides change what the preset fixes (tests draw from smaller runs)."""
    frame = load_table(results_dir, fig.TABLE, fig.COLUMNS, fig.NAME, fig.HINT)
    fixed = preset_filter(fig.ENTRY, fig.PRESET, overrides)
    return preset_rows(frame, fixed, fig.NAME, Path(results_dir) / f"{fig.TABLE}.parquet", fig.HINT)
