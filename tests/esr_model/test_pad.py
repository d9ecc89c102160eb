"""A batch's ids padded to its longest: every id in its place, padding and mask after it."""

from __future__ import annotations

import numpy as np

from esr_model.tuned import pad


def test_each_row_holds_its_ids_then_padding_and_the_mask_marks_the_ids():
    rows = [[101, 7, 102], [101, 102], [101] + list(range(1000, 1030)) + [102], [5]]
    ids, mask = pad(rows, pad_id=3)
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (4, 32)
    for i, row in enumerate(rows):
        assert ids[i, : len(row)].tolist() == row and (ids[i, len(row):] == 3).all()
        assert mask[i].tolist() == [1] * len(row) + [0] * (32 - len(row))


def test_one_row_needs_no_padding():
    ids, mask = pad([[101, 9, 102]], pad_id=0)
    assert ids.tolist() == [[101, 9, 102]] and mask.tolist() == [[1, 1, 1]]
