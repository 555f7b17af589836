"""``dsahal plan``: the packed KV cache's capacity for a model, formats and parallel layout.

The answer comes first: the tokens and full contexts that fit in the given memory per device, the bytes
per token and the comparisons with FP8 and with TP alone. --verbose adds the details: the row layout
(where each DSA layer's pages sit in a row), the per-request KDA state layout and the per-layer padded
layouts, with runs of identical rows folded into one row with a count. --json prints everything,
unfolded.

Every figure comes from the config's layer counts and dimensions, the formats' bytes per token and the
sharding rules (TP divides KDA heads and replicates MLA latent and index keys; DCP=W stores every W-th
token per rank). Nothing is looked up.

The cache budget is either given (--memory-gib) or what is left of a device's memory (--device-gib) after
the weights each device holds: dense, routed and shared experts' weights counted from the config, under
TP (heads, widths, vocab) and EP (routed experts dealt out), in --weights-dtype (dsahal.model.weight_memory).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from ..cache import DEFAULT_ROW_ROUNDING, ROW_ROUNDINGS, plan_layout
from ..model.weight_memory import WEIGHT_DTYPES, weight_memory
from ..config import load_config
from ..formats import INDEX_FORMATS, LATENT_FORMATS
from .capacity import capacity, layout_report, padded_layouts, standard_comparisons

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
TOKEN_EXAMPLES = "1000000, 128k, 1M or 1Mi"  # k, M, G: powers of 10; Ki, Mi, Gi: powers of 2
# The library's argument names -> the command's flags, so an error from plan_layout names the flag.
_FLAGS = {"tp": "--tp", "dcp": "--dcp", "block_tokens": "--block-tokens", "row_rounding": "--row-rounding",
          "latent_fmt": "--latent-fmt", "index_fmt": "--index-fmt", "context_tokens": "--context",
          "budget_bytes": "--memory-gib", "ep": "--ep", "weights_dtype": "--weights-dtype"}


def parse_tokens(text: str, flag: str = "--context") -> int:
    """``"1000000"``, ``"128k"`` (10^3), ``"1M"`` (10^6), ``"1Mi"`` (2^20) -> an int >= 1."""
    match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([kKmMgG]i?)?\s*", str(text))
    if not match:
        raise ValueError(f"dsahal plan: argument '{flag}' expected a token count like {TOKEN_EXAMPLES}, "
                         f"got {text!r}")
    value = float(match.group(1)) * _SUFFIXES[(match.group(2) or "").lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"dsahal plan: argument '{flag}' expected a whole token count >= 1 "
                         f"(like {TOKEN_EXAMPLES}), got {text!r}")
    return int(value)


def check_memory_gib(value: float, flag: str = "--memory-gib") -> float:
    """A finite number of GiB > 0 whose byte count is finite too (``inf``, or ``1e300`` GiB, would overflow the
    byte count, ``nan`` compares false)."""
    if not (math.isfinite(value) and value > 0 and math.isfinite(value * 2**30)) or int(value * 2**30) < 1:
        raise ValueError(f"dsahal plan: argument '{flag}' expected a finite number of GiB > 0 "
                         f"(at least one byte, at most {sys.float_info.max / 2**30:.4g} GiB), got {value}")
    return value


def build_plan(config_name: str, latent_fmt: str, index_fmt: str, tp: int, dcp: int, block_tokens: int,
               memory_gib: float | None, context: int, row_rounding: str = DEFAULT_ROW_ROUNDING, *, ep: int = 1,
               weights_dtype: str = "bf16", device_gib: float | None = None) -> dict:
    """Everything ``dsahal plan`` prints, as plain data. The cache budget: ``memory_gib``, or (exactly one of
    the two) ``device_gib`` less the weights per device."""
    if (memory_gib is None) == (device_gib is None):
        raise ValueError("dsahal plan: expected exactly one of '--memory-gib' (the cache budget per device) and "
                         "'--device-gib' (a device's memory, the weights' share subtracted), got "
                         + ("both" if memory_gib is not None else "neither"))
    config = load_config(config_name)
    layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens, tp=tp,
                         dcp=dcp, row_rounding=row_rounding)
    weights = weight_memory(config, tp=tp, ep=ep, weights_dtype=weights_dtype)
    if memory_gib is not None:
        budget = int(check_memory_gib(memory_gib) * 2**30)
    else:
        device = int(check_memory_gib(device_gib, "--device-gib") * 2**30)
        budget = device - weights.device_bytes
        if budget < 1:
            raise ValueError(f"dsahal plan: argument '--device-gib' expected more than the "
                             f"{weights.device_bytes / 2**30:.2f} GiB of {weights_dtype} weights each device holds "
                             f"under TP{tp} EP{ep}, got {device_gib}; raise --tp or --ep, or use --weights-dtype fp8")
    return {
        "weights": weights.to_dict() | {"device_gib": device_gib, "cache_budget_bytes": budget},
        "config": {"name": config.name, "layers": config.num_layers, "dsa_layers": len(config.dsa_layers),
                   "kda_layers": len(config.kda_layers), "kda_heads": config.kda_num_heads,
                   "kda_head_dim": config.kda_head_dim},
        "layout": layout_report(layout),
        "capacity": capacity(layout, budget, context).to_dict(),
        "padded_layouts": [p.to_dict() for p in padded_layouts(layout, budget, context)],
        "comparisons": [c.to_dict() for c in standard_comparisons(config, layout, budget, context)],
    }


# ------------------------------------------------------------------ folding repeated rows
def fold_runs(items: list[dict], layer_key: str = "layer") -> list[dict]:
    """Fold consecutive groups of ``items`` that repeat with a constant offset step into one entry.

    ``items`` are page or state records (``layer``, ``offset``, ``nbytes`` and for pages ``kind``/``fmt``)
    in row order. They are grouped by layer (a DSA layer has two pages); consecutive layers whose
    groups have the same shape (same kinds, formats, sizes and offsets relative to the group's first
    offset) and whose first offsets advance by the same step form one run. Returns one dict per run:
    ``layers`` (their indices), ``first`` (the first layer's records), ``step`` (bytes between layers;
    0 for a single layer)."""
    groups: list[list[dict]] = []
    for item in items:
        if groups and groups[-1][0][layer_key] == item[layer_key]:
            groups[-1].append(item)
        else:
            groups.append([item])

    def shape(group):
        base = group[0]["offset"]
        return tuple((i.get("kind"), i.get("fmt"), i["nbytes"], i["offset"] - base) for i in group)

    runs: list[dict] = []
    for group in groups:
        run = runs[-1] if runs else None
        if run is not None and shape(group) == shape(run["first"]):
            step = group[0]["offset"] - run["last_offset"]
            if len(run["layers"]) == 1 or step == run["step"]:
                run["layers"].append(group[0][layer_key])
                run["step"], run["last_offset"] = step, group[0]["offset"]
                continue
        runs.append({"layers": [group[0][layer_key]], "first": group, "step": 0, "last_offset": group[0]["offset"]})
    for run in runs:
        del run["last_offset"]
    return runs


def layer_list(layers: list[int], limit: int = 4) -> str:
    """``[0, 1, 2, 4, 5, 6, 8]`` -> ``"0-2, 4-6, 8"``; with more than ``limit`` ranges, the first ones,
    ``...`` and the last one (the count is printed beside it)."""
    ranges: list[list[int]] = []
    for layer in layers:
        if ranges and layer == ranges[-1][1] + 1:
            ranges[-1][1] = layer
        else:
            ranges.append([layer, layer])
    step = layers[1] - layers[0] if len(layers) > 2 else 0
    if step > 1 and all(b - a == step for a, b in zip(layers, layers[1:])):
        return f"{layers[0]}, {layers[1]}, ..., {layers[-1]} (every {step})"
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges]
    if len(text) > limit:
        text = text[:limit - 1] + ["...", text[-1]]
    return ", ".join(text)


# ------------------------------------------------------------------ text output
def _n(value: int) -> str:
    return f"{value:,}"


def _rounding(lay: dict) -> str:
    return "a power of two" if lay["row_rounding"] == "pow2" else "256-B pages"


def weights_line(weights: dict) -> str:
    """The weights one device holds, and where the cache budget came from."""
    parts = weights["device_bytes_by_part"]
    experts = (f", routed experts {_gib(parts['routed_experts'])} ({weights['routed_experts_per_device']} of "
               f"{weights['routed_experts_per_layer']} per MoE layer) + shared {_gib(parts['shared_experts'])}"
               if weights["routed_experts_per_layer"] else "")
    line = (f"weights per device: {_gib(weights['device_bytes'])} {weights['weights_dtype']} under TP{weights['tp']} "
            f"EP{weights['ep']} (attention {_gib(parts['attention'])}, dense MLP {_gib(parts['dense_mlp'])}{experts}, "
            f"embeddings {_gib(parts['embeddings'])}) of {weights['parameters'] / 1e9:,.2f} B parameters")
    if weights["device_gib"] is not None:
        line += (f"; cache budget = {weights['device_gib']:g} GiB per device - weights = "
                 f"{_gib(weights['cache_budget_bytes'])}")
    return line


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def summary_lines(plan: dict) -> list[str]:
    """The answer: what fits, bytes per token, the comparisons, then the model and row in two lines."""
    cfg, lay, cap = plan["config"], plan["layout"], plan["capacity"]
    parallel = f"TP{lay['tp']}" + (f" DCP{lay['dcp']}" if lay["dcp"] > 1 else "")
    lines = [
        f"{cfg['name']}, latent {lay['latent_fmt']} + index {lay['index_fmt']}, {parallel}: "
        f"{cap['budget_bytes'] / 2**30:.2f} GiB of cache per device",
        f"  tokens that fit: {_n(cap['tokens'])} across the group ({_n(cap['tokens_per_device'])} stored per device)",
        f"  full {_n(cap['context_tokens'])}-token contexts: {_n(cap['full_contexts'])} "
        f"(each {_n(cap['blocks_per_context'])} block rows + {lay['rows_per_state']} KDA-state rows per device)",
        f"  bytes per token per device: {lay['payload_bytes_per_token']:.1f} payload, "
        f"{lay['row_bytes_per_token']:.1f} as laid out",
    ]
    for comp in plan["comparisons"]:
        lines.append(f"  vs {comp['baseline']}: {comp['tokens_ratio']:.2f}x tokens as laid out "
                     f"({comp['payload_ratio']:.2f}x by bytes per token); full contexts "
                     f"{_n(comp['contexts'][0])} -> {_n(comp['contexts'][1])}")
    padding = lay["row_padding_bytes"]
    state = (f"KDA state per request per device: {_n(lay['state_bytes'])} B -> {lay['rows_per_state']} rows "
             f"(recurrent {_n(lay['recurrent_state_bytes'])} B + short-conv {_n(lay['conv_state_bytes'])} B)"
             if lay["states"] else "no KDA state")
    lines += [
        "",
        f"model: {cfg['layers']} layers ({cfg['dsa_layers']} DSA, {cfg['kda_layers']} KDA); latent "
        f"{lay['latent_fmt']} {lay['latent_token_bytes']} B/token, index {lay['index_fmt']} "
        f"{lay['index_token_bytes']} B/token; {lay['block_tokens']}-token blocks",
        f"row: {_n(lay['payload_bytes_per_block'])} B of pages + {_n(padding)} B padding = "
        f"{_n(lay['row_bytes'])} B ({100 * padding / lay['row_bytes']:.1f}% padding, rounded to {_rounding(lay)}); "
        f"{_n(cap['rows'])} rows per device",
        state,
        weights_line(plan["weights"]),
    ]
    return lines


def detail_lines(plan: dict) -> list[str]:
    """--verbose: the row layout, the KDA state layout and the per-layer padded layouts, folded."""
    lay = plan["layout"]
    lines = ["", f"row layout: one {lay['block_tokens']}-token block of every DSA layer; byte offsets within "
                 "the row",
             "(a row with a count stands for that many layers, i = 0, 1, ... in order):",
             f"  {'layers':<32} {'count':>5}  {'page':<6} {'format':<10} {'bytes':>10}  offset"]
    for run in fold_runs(lay["pages"]):
        count = len(run["layers"])
        for j, page in enumerate(run["first"]):
            offset = _n(page["offset"]) + (f" + {_n(run['step'])} x i" if count > 1 else "")
            head = (layer_list(run["layers"]), str(count)) if j == 0 else ("", "")
            lines.append(f"  {head[0]:<32} {head[1]:>5}  {page['kind']:<6} {page['fmt']:<10} "
                         f"{_n(page['nbytes']):>10}  {offset}")
    states = lay["states"]
    if states:
        width = lay["kda_conv_kernel"] - 1
        lines += ["", f"KDA state per request per device: {_n(lay['state_bytes'])} B = {len(states)} layers x "
                      f"(recurrent {lay['kda_heads_local']} heads x {lay['kda_key_dim']} x {lay['kda_value_dim']} + "
                      f"short-conv 3 x {width} x {_n(lay['kda_conv_channels'])}) fp32",
                  f"  -> {lay['rows_per_state']} rows ({_n(lay['state_padding_bytes'])} B padding); "
                  "offsets within the state slot:",
                  f"  {'layers':<32} {'count':>5}  {'state':<10} {'bytes':>10}  offset"]
        for kind, specs in (("recurrent", states), ("short-conv", lay.get("conv_states") or ())):
            for run in fold_runs(specs):
                count, state = len(run["layers"]), run["first"][0]
                offset = _n(state["offset"]) + (f" + {_n(run['step'])} x i" if count > 1 else "")
                lines.append(f"  {layer_list(run['layers']):<32} {count:>5}  {kind:<10} {_n(state['nbytes']):>10}  "
                             f"{offset}")
    lines += ["", "per-layer padded layouts, same budget (for comparison with the packed row):"]
    for padded in plan["padded_layouts"]:
        lines.append(f"  {padded['name']}: {padded['description']}")
        lines.append(f"    {_n(padded['bytes_per_block'])} B per block, {100 * padded['waste_fraction']:.1f}% "
                     f"padding; tokens {_n(padded['tokens'])}, full contexts {_n(padded['full_contexts'])}")
    return lines


def print_plan(plan: dict, out=None, verbose: bool = False) -> None:
    out = out or sys.stdout
    lines = summary_lines(plan) + (detail_lines(plan) if verbose else
                                   ["", "(--verbose: the row layout, the KDA state layout and the per-layer "
                                        "padded layouts; --json: everything)"])
    print("\n".join(lines), file=out)


# ------------------------------------------------------------------ the command
def _name_the_flag(message: str) -> str:
    """``argument 'tp'`` (the library's name) -> ``argument '--tp'`` (the command's flag)."""
    message = re.sub(r"^dsahal\.[\w.]+: ", "", message)  # the library function's name: the command is named instead
    return re.sub(r"argument '(\w+)'", lambda m: f"argument '{_FLAGS.get(m.group(1), m.group(1))}'", message)


def _write(text: str) -> int:
    """Print to stdout; a reader that closed the pipe early (``dsahal plan --json | head``) ends the
    command quietly: the rest of the output is not wanted, which is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a command killed by the closed pipe would report
    return 0


def run(args) -> int:
    try:
        context = parse_tokens(args.context)
        if args.memory_gib is not None:
            check_memory_gib(args.memory_gib)
        try:
            load_config(args.config)
        except KeyError as exc:
            raise ValueError(f"dsahal plan: argument '--config' expected a model config with every field, "
                             f"{args.config!r} lacks {exc}") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"dsahal plan: argument '--config': {exc}") from None
        plan = build_plan(args.config, args.latent_fmt, args.index_fmt, args.tp, args.dcp, args.block_tokens,
                          args.memory_gib, context, args.row_rounding, ep=args.ep,
                          weights_dtype=args.weights_dtype, device_gib=args.device_gib)
    except (ValueError, TypeError) as exc:
        message = _name_the_flag(str(exc))
        print(f"error: {message if message.startswith('dsahal plan') else 'dsahal plan: ' + message}",
              file=sys.stderr)
        return 2
    if args.json:
        return _write(json.dumps(plan, indent=2) + "\n")
    from io import StringIO

    text = StringIO()
    print_plan(plan, text, verbose=args.verbose)
    return _write(text.getvalue())


# argparse takes an argument that starts with '-' for an option unless it looks like a negative number
# ("-5"), so `--context -1M` failed as "expected one argument". Token counts with a suffix count as
# numbers here, so the value reaches parse_tokens and its message. (A private attribute of argparse's
# parser, present in Python 3.10-3.14; tests/test_cli_plan_errors.py checks the behaviour.)
_NEGATIVE_VALUE = re.compile(r"^-\d+(?:\.\d+)?(?:[kKmMgG]i?)?$")


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="packed KV cache capacity planner: the tokens and contexts that fit",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser._negative_number_matcher = _NEGATIVE_VALUE
    parser.add_argument("--config", default="k31-pro", help="preset name or JSON config path (default: %(default)s)")
    parser.add_argument("--latent-fmt", default="fp8", choices=sorted(LATENT_FORMATS),
                        help="MLA latent format (default: %(default)s)")
    parser.add_argument("--index-fmt", default="fp8", choices=sorted(INDEX_FORMATS),
                        help="index-key format (default: %(default)s)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size, divides the KDA heads "
                                                          "(default: %(default)s)")
    parser.add_argument("--dcp", type=int, default=1, help="decode-context-parallel size, shards the tokens "
                                                           "(default: %(default)s)")
    parser.add_argument("--block-tokens", type=int, default=64,
                        help="tokens per block per rank (default: %(default)s)")
    parser.add_argument("--row-rounding", default=DEFAULT_ROW_ROUNDING, choices=ROW_ROUNDINGS,
                        help="row bytes rounded to a multiple of 256 B ('page') or to a power of two ('pow2', "
                             "for consumers that need power-of-two buffers) (default: %(default)s)")
    parser.add_argument("--memory-gib", type=float, default=None,
                        help="cache memory per device, GiB (this or --device-gib is required)")
    parser.add_argument("--device-gib", type=float, default=None,
                        help="memory per device, GiB: the cache budget is what the weights each device holds "
                             "leave of it (this or --memory-gib is required)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size: each device holds "
                                                          "n_routed_experts / ep routed experts (default: %(default)s)")
    parser.add_argument("--weights-dtype", default="bf16", choices=sorted(WEIGHT_DTYPES),
                        help="weights' storage (fp8: e4m3 linear weights with 128x128 block scales, as DeepSeek's "
                             "checkpoints) (default: %(default)s)")
    parser.add_argument("--context", required=True,
                        help=f"context length for 'full contexts': {TOKEN_EXAMPLES} (k, M, G: powers of 10; "
                             "Ki, Mi, Gi: powers of 2) (required)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also the row layout, the KDA state layout and the per-layer padded layouts")
    parser.add_argument("--json", action="store_true", help="everything, machine-readable (unfolded)")
    parser.set_defaults(func=run)
