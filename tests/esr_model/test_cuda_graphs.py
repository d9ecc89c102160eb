"""The bucket a batch's captured graph is chosen by, and the batch padded into it (the CUDA part
runs only on a GPU: bench/gpu/run.sh checks it there against eager)."""

from __future__ import annotations

import numpy as np

from esr_model.cuda_graphs import Buckets


def test_a_batch_runs_in_the_smallest_bucket_that_holds_it_and_none_past_the_largest():
    b = Buckets(max_batch=128, max_length=256, pad_id=0)
    assert b.batches == (1, 2, 4, 8, 16, 32, 64, 128) and b.lengths == (16, 32, 64, 128, 256)
    assert b.shape_for(1, 3) == (1, 16)
    assert b.shape_for(17, 16) == (32, 16)
    assert b.shape_for(64, 33) == (64, 64)
    assert b.shape_for(128, 256) == (128, 256)
    assert b.shape_for(129, 10) is None and b.shape_for(3, 257) is None


def test_a_limit_between_two_sizes_is_a_bucket_of_its_own():
    assert Buckets(max_batch=48, max_length=200, pad_id=0).batches[-2:] == (32, 48)
    assert Buckets(max_batch=48, max_length=200, pad_id=0).lengths[-2:] == (128, 200)


def test_the_batch_sits_top_left_and_everything_else_is_masked_padding():
    b = Buckets(max_batch=8, max_length=16, pad_id=7)
    ids = np.array([[101, 5, 102], [101, 102, 0]], np.int64)
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.int64)
    into_ids, into_mask = np.full((4, 16), -1, np.int64), np.full((4, 16), -1, np.int64)
    b.fill(ids, mask, into_ids, into_mask)
    assert (into_ids[:2, :3] == ids).all() and (into_mask[:2, :3] == mask).all()
    assert (into_ids[:, 3:] == 7).all() and (into_ids[2:] == 7).all()
    assert (into_mask[:2, 3:] == 0).all()
    # padding rows attend to one token (a row with none would be NaN), and are never returned
    assert into_mask[2:].tolist() == [[1] + [0] * 15] * 2
