"""A paged decode batch the block-tile indexer tests share (tests/test_indexer_tiles_alu.py,
tests/test_indexer_mxfp4_words.py)."""


def paged_case(block_tokens: int):
    """Three requests over 4 blocks each: request 0 a run of 5 tokens (positions ending mid-tile), request 1
    one token, request 2 two tokens (one of them early: a shorter causal bound); an unmapped (-1) and an
    out-of-range (99) block. -> (block table ``[3, 4]``, request ids ``[8]``, positions ``[8]``), int32."""
    import torch  # (imported here: the interpreter children set TRITON_INTERPRET before anything imports triton)

    table = torch.tensor([[3, 1, -1, 0], [2, 4, 99, 5], [6, 0, 7, 1]], dtype=torch.int32)
    b = block_tokens
    req = torch.tensor([0, 0, 0, 0, 0, 1, 2, 2], dtype=torch.int32)
    pos = torch.tensor([3 * b - 5, 3 * b - 4, 3 * b - 3, 3 * b - 2, 3 * b - 1, 4 * b - 2, b // 2 + 1, 4 * b - 3],
                       dtype=torch.int32)
    return table, req, pos
