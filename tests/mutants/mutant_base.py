"""Shared by the deliberately broken backends: the reference's ops with one op replaced.

Each ``mutant_*.py`` module here is a dsahal plugin (load it with
``PYTHONPATH=tests/mutants DSAHAL_PLUGIN_MODULES=mutant_x``) whose backend the conformance suite
must fail, naming the broken property. A mutant that survives is a missing property.
"""
from __future__ import annotations

from dsahal.reference.plugin import reference_backend
from dsahal.registry import Backend, Capabilities


def mutant_backend(name: str, broken: dict, *, batch_invariant: bool = False, description: str) -> Backend:
    """The reference with ``broken`` ops swapped in, claiming determinism (and optionally batch
    invariance) so every property applies. Priority below everything: never auto-selected."""
    reference = reference_backend()
    # The reference's own dsa_attention composes the reference's functions directly; a mutant leaves it
    # out, so the registry composes the mutant's own ops (a broken indexer then breaks the DSA layer too).
    inherited = {op: fn for op, fn in reference.ops.items() if op != "dsa_attention"}
    return Backend(
        name=name,
        ops={**inherited, **broken},
        tags=frozenset({"mutant", "cpu"}),
        priority=-100,
        capabilities=Capabilities(deterministic=True, batch_invariant=batch_invariant, distributed=True),
        description=description,
    )
