"""``smdistributed.dataparallel``: Shoal's data-parallel runtime under the closed library's name."""
