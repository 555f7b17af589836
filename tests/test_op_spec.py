"""One spec per op: the public wrapper, the custom op, the validator and every built-in backend's routes
take the same argument names in the same order (dsahal.ops.catalog.SPECS)."""
import importlib
import inspect

import pytest
import torch

import dsahal
from dsahal.ops.catalog import COLLECTIVE_OPS, OP_NAMES, SPECS
from dsahal.registry import registry, resolve_lazy

VALIDATORS = {
    "cache_write": "dsahal.ops.cache_write:validate_cache_write",
    "indexer_score": "dsahal.ops.indexer:validate_indexer_score",
    "topk": "dsahal.ops.topk:validate_topk",
    "topk_merge": "dsahal.ops.topk_merge:validate_topk_merge",
    "positions_to_slots": "dsahal.ops.slots:validate_positions_to_slots",
    "sparse_mla": "dsahal.ops.sparse_mla:validate_sparse_mla",
    "lse_combine": "dsahal.ops.lse_combine:validate_lse_combine",
    "kda_decode": "dsahal.ops.kda:validate_kda_decode",
    "kda_prefill": "dsahal.ops.kda:validate_kda_prefill",
    "dsa_attention": "dsahal.ops.dsa_attention:validate_dsa_attention",
}


def positional_names(fn):
    return tuple(p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def public_names(fn):
    return tuple(p.name for p in inspect.signature(fn).parameters.values() if p.name != "check")


@pytest.mark.parametrize("op", OP_NAMES)
def test_the_public_wrapper_takes_the_spec_arguments_in_the_spec_order(op):
    assert public_names(getattr(dsahal.ops, op)) == SPECS[op].params


@pytest.mark.parametrize("op", sorted(set(OP_NAMES) - COLLECTIVE_OPS))
def test_the_custom_op_schema_names_the_spec_arguments_in_order(op):
    schema = getattr(torch.ops.dsahal, op).default._schema
    assert tuple(a.name for a in schema.arguments) == SPECS[op].params


@pytest.mark.parametrize("op", sorted(VALIDATORS))
def test_the_validator_takes_the_spec_arguments_in_order(op):
    assert positional_names(resolve_lazy(VALIDATORS[op])) == SPECS[op].params


def _importable(ref) -> bool:
    if not isinstance(ref, str):
        return True
    try:
        importlib.import_module(ref.partition(":")[0])
    except ImportError:  # a kernel library absent here (torch_xla): its signatures are checked where it is
        return False
    return True


@pytest.mark.parametrize("backend", ["reference", "nvidia", "amd", "ppu", "tpu"])
def test_every_built_in_route_takes_the_spec_arguments_in_order(backend):
    pytest.importorskip("triton")
    declared = registry().records[backend].backend
    checked = 0
    for op in OP_NAMES:
        for route in declared.routes(op):
            for role, ref in (("implementation", route.fn), ("verifier", route.verifier)):
                if ref is None or not _importable(ref):
                    continue
                fn = resolve_lazy(ref)
                names = positional_names(fn)
                has_varargs = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
                assert has_varargs or names[:len(SPECS[op].params)] == SPECS[op].params, (backend, op, route.name, role)
                checked += 1
    assert checked > 0
