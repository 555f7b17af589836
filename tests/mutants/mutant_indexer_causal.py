"""Mutant: the indexer's causal bound is off by one (token t sees keys s < position, not s <= position)."""
from dsahal.reference.indexer import indexer_score as reference_indexer_score
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "indexer_score.matches_reference"


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    return reference_indexer_score(q, weights, index_pages, block_table, req_ids, positions - 1, index_fmt,
                                   max_context)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_indexer_causal", {"indexer_score": indexer_score},
                           description="indexer excludes the query's own position")]
