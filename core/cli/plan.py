"""``dsahal plan``: the packed KV cache's row layout and capacity for a model, formats and parallel layout.

Every figure comes from the config's layer counts and dimensions, the formats' bytes per token and the
sharding rules (TP divides KDA heads and replicates MLA latent/index keys; DCP=W stores every W-th
token per rank). Nothing is looked up.
"""
from __future__ import annotations

import json
import re
import sys

from ..cache import ROW_ROUNDINGS, capacity, padded_layouts, plan_layout, standard_comparisons
from ..config import load_config
from ..formats import INDEX_FORMATS, LATENT_FORMATS

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_tokens(text: str) -> int:
    """``"1000000"``, ``"128k"`` (10^3), ``"1M"`` (10^6), ``"1Mi"`` (2^20) -> an int >= 1."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?)?\s*", str(text))
    if not match:
        raise ValueError(f"expected a token count like 1000000, 128k, 1M or 1Mi, got {text!r}")
    value = float(match.group(1)) * _SUFFIXES[(match.group(2) or "").lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"expected a whole token count >= 1, got {text!r}")
    return int(value)


def build_plan(config_name: str, latent_fmt: str, index_fmt: str, tp: int, dcp: int, block_tokens: int,
               memory_gib: float, context: int, row_rounding: str = "pow2") -> dict:
    """Everything ``dsahal plan`` prints, as plain data."""
    if not memory_gib > 0:
        raise ValueError(f"dsahal plan: argument '--memory-gib' expected a number > 0, got {memory_gib}")
    config = load_config(config_name)
    layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens, tp=tp,
                         dcp=dcp, row_rounding=row_rounding)
    budget = int(memory_gib * 2**30)
    return {
        "config": {"name": config.name, "layers": config.num_layers, "dsa_layers": len(config.dsa_layers),
                   "kda_layers": len(config.kda_layers), "kda_heads": config.kda_num_heads,
                   "kda_head_dim": config.kda_head_dim},
        "layout": layout.to_dict(),
        "capacity": capacity(layout, budget, context).to_dict(),
        "padded_layouts": [p.to_dict() for p in padded_layouts(layout, budget, context)],
        "comparisons": [c.to_dict() for c in standard_comparisons(config, layout, budget, context)],
    }


def _fmt_int(value: int) -> str:
    return f"{value:,}"


def print_plan(plan: dict, out=None) -> None:
    out = out or sys.stdout
    cfg, lay, cap = plan["config"], plan["layout"], plan["capacity"]
    say = lambda text="": print(text, file=out)  # noqa: E731 - a local printer keeps the layout readable
    parallel = f"TP{lay['tp']}" + (f" DCP{lay['dcp']}" if lay["dcp"] > 1 else "")
    say(f"model {cfg['name']}: {cfg['layers']} layers ({cfg['dsa_layers']} DSA, {cfg['kda_layers']} KDA); "
        f"latent {lay['latent_fmt']} ({lay['latent_token_bytes']} B/token), index {lay['index_fmt']} "
        f"({lay['index_token_bytes']} B/token); {parallel}; {lay['block_tokens']}-token blocks; "
        f"rows rounded to {'a power of two' if lay['row_rounding'] == 'pow2' else 'a multiple of 256 B'}")
    say()
    say("row layout (one block of every DSA layer; byte offsets within the row):")
    say(f"  {'layer':>5}  {'kind':<6}  {'format':<10}  {'offset':>10}  {'bytes':>9}")
    for page in lay["pages"]:
        say(f"  {page['layer']:>5}  {page['kind']:<6}  {page['fmt']:<10}  {page['offset']:>10}  {page['nbytes']:>9}")
    padding = lay["row_padding_bytes"]
    say(f"  row: {_fmt_int(lay['payload_bytes_per_block'])} B of pages + {_fmt_int(padding)} B padding = "
        f"{_fmt_int(lay['row_bytes'])} B ({100 * padding / lay['row_bytes']:.1f}% padding)")
    say()
    states = lay["states"]
    if states:
        say(f"KDA state per request per device: {len(states)} layers x {lay['kda_heads_local']} heads x "
            f"{lay['kda_key_dim']} x {lay['kda_value_dim']} fp32 = {_fmt_int(lay['state_bytes'])} B -> "
            f"{lay['rows_per_state']} rows ({_fmt_int(lay['state_padding_bytes'])} B padding)")
        say(f"  {'layer':>5}  {'offset':>12}  {'bytes':>9}   (within the state slot)")
        for state in states:
            say(f"  {state['layer']:>5}  {state['offset']:>12}  {state['nbytes']:>9}")
        say()
    say(f"bytes per token per device: {lay['payload_bytes_per_token']:.1f} payload "
        f"({cfg['dsa_layers']} x ({lay['latent_token_bytes']} + {lay['index_token_bytes']}) B / DCP {lay['dcp']}), "
        f"{lay['row_bytes_per_token']:.1f} as laid out")
    say(f"budget {cap['budget_bytes'] / 2**30:.2f} GiB per device = {_fmt_int(cap['rows'])} rows")
    say(f"  tokens that fit: {_fmt_int(cap['tokens'])} across the group ({_fmt_int(cap['tokens_per_device'])} "
        f"stored per device)")
    say(f"  full {_fmt_int(cap['context_tokens'])}-token contexts: {cap['full_contexts']} "
        f"(each {cap['blocks_per_context']} block rows + {lay['rows_per_state']} state rows per device)")
    say()
    say("per-layer padded layouts, same budget (for comparison):")
    for padded in plan["padded_layouts"]:
        say(f"  {padded['name']}: {padded['description']}")
        say(f"    {_fmt_int(padded['bytes_per_block'])} B per block, {100 * padded['waste_fraction']:.1f}% padding; "
            f"tokens {_fmt_int(padded['tokens'])}, full contexts {padded['full_contexts']}")
    if plan["comparisons"]:
        say()
        say("comparisons (same budget and context length):")
        for comp in plan["comparisons"]:
            say(f"  {comp['name']}: {comp['tokens_ratio']:.2f}x tokens as laid out, "
                f"{comp['payload_ratio']:.2f}x by bytes per token; full contexts {comp['contexts'][0]} -> "
                f"{comp['contexts'][1]}")


def run(args) -> int:
    try:
        context = parse_tokens(args.context)
        plan = build_plan(args.config, args.latent_fmt, args.index_fmt, args.tp, args.dcp, args.block_tokens,
                          args.memory_gib, context, args.row_rounding)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="packed KV cache layout and capacity planner", description=__doc__)
    parser.add_argument("--config", default="k31-pro", help="preset name or JSON config path (default k31-pro)")
    parser.add_argument("--latent-fmt", default="fp8", choices=sorted(LATENT_FORMATS), help="MLA latent format")
    parser.add_argument("--index-fmt", default="fp8", choices=sorted(INDEX_FORMATS), help="index-key format")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (divides KDA heads)")
    parser.add_argument("--dcp", type=int, default=1, help="decode-context-parallel size (shards tokens)")
    parser.add_argument("--block-tokens", type=int, default=64, help="tokens per block per rank (default 64)")
    parser.add_argument("--row-rounding", default="pow2", choices=ROW_ROUNDINGS,
                        help="row bytes rounded to a power of two (default) or to 256 B")
    parser.add_argument("--memory-gib", type=float, required=True, help="cache memory per device, GiB")
    parser.add_argument("--context", required=True, help="context length for 'full contexts': 1000000, 128k, 1M, 1Mi")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
