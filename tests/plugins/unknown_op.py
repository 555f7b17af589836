"""A plugin that misspells an op name (``lse_combin``) next to one it spells right."""
from dsahal.reference.lse_combine import lse_combine
from dsahal.reference.topk import topk
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="typo", ops={"lse_combin": lse_combine, "topk": topk}, priority=-1,
                    tags=frozenset({"test"}))]
