"""Measured-program datasets: collected on a device, stored as Parquet, replayed offline.

``store`` reads and writes them without TVM; ``collect`` measures one; ``surrogate`` fits
a model that predicts the programs a dataset does not hold.
"""

from .store import Dataset, WorkloadData

__all__ = ["Dataset", "WorkloadData"]
