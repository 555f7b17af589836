"""``dsahal run``: the hybrid model end to end on a backend — tokens/s, per-op times, peak memory, --check.

A batch of requests with different prompt lengths (request i has ``N - i·N/(2B)`` prompt tokens for
``--prompt-len N --batch B``) is prefilled in chunks and decoded ``--decode M`` tokens each over the
packed cache, on the selected backend. ``--check`` replays the same requests on the reference
backend, forced to emit the same tokens so every step's logits are comparable, and reports the
largest logit difference and how often the reference's greedy choice agrees.
"""
from __future__ import annotations

import json
import math
import sys

import torch

from ..config import load_config
from ..registry import RegistryError, use_backend
from ..registry.state import active_table
from ..engine.report import ProgressBar, compare_runs, peak_memory, print_report

FINGERPRINT_ARGS = ("backend", "batch", "prompt_len", "decode", "seed", "dtype", "latent_fmt", "index_fmt",
                    "block_tokens", "chunk", "temperature", "weights", "split_dsa", "draft_tokens")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def prompt_lengths(batch: int, longest: int) -> list[int]:
    """Different lengths from ``longest`` down to about half of it."""
    return [max(1, longest - (i * longest) // (2 * batch)) for i in range(batch)]


def make_requests(args, vocab_size: int, *, forced: list[list[int]] | None = None):
    from ..engine import Request
    from ..model import SamplingParams

    generator = torch.Generator().manual_seed(args.seed)
    requests = []
    for i, length in enumerate(prompt_lengths(args.batch, args.prompt_len)):
        prompt = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        sampling = SamplingParams(args.temperature, seed=args.seed + i if args.temperature > 0 else None)
        requests.append(Request(i, prompt, args.decode, sampling, forced_tokens=forced[i] if forced else None,
                                record_logits=args.check))
    return requests


def resolve_device(args) -> torch.device:
    if args.device:
        return torch.device(args.device)
    gpu = active_table().record.backend.tags & {"gpu", "cuda", "rocm"}
    return torch.device("cuda" if gpu and torch.cuda.is_available() else "cpu")


def start_dcp(args, config):
    """Join the torchrun process group for ``--dcp W``; returns (attention, distributed context)."""
    from ..distributed import StartupMismatch, init_distributed
    from ..engine.dcp import DcpDsaAttention

    fingerprint = {"config": json.dumps(config.to_dict(), sort_keys=True), "dcp": args.dcp,
                   **{name: getattr(args, name) for name in FINGERPRINT_ARGS}}
    try:
        context = init_distributed(fingerprint, timeout_s=args.dcp_timeout)
    except StartupMismatch as exc:
        raise ValueError(str(exc)) from None
    if context.world_size != args.dcp:
        raise ValueError(f"--dcp {args.dcp} expected a group of {args.dcp} processes, torchrun started "
                         f"{context.world_size}")
    return DcpDsaAttention(context.rank, context.world_size, check=True), context


def execute(args, model, config, device, attention, *, forced=None, progress=True, cuda_graph=None):
    """Run the requests once on the active backend; returns (finished requests, engine, op timer).

    ``cuda_graph`` (default ``--cuda-graph``): replay decode steps from CUDA graphs."""
    from ..engine import Engine, OpTimer, build_cache
    from ..engine.speculative import prompt_lookup_drafter

    requests = make_requests(args, config.vocab_size, forced=forced)
    max_context = max(r.total_tokens for r in requests)
    cache = build_cache(config, max_batch=args.batch, max_context=max_context, latent_fmt=args.latent_fmt,
                        index_fmt=args.index_fmt, block_tokens=args.block_tokens, device=device,
                        context_shards=getattr(attention, "context_shards", 1))
    drafter = prompt_lookup_drafter(args.draft_tokens) if args.draft_tokens else None
    engine = Engine(model, cache, latent_fmt=args.latent_fmt, index_fmt=args.index_fmt, max_batch=args.batch,
                    max_context=max_context, prefill_chunk_tokens=args.chunk, attention=attention,
                    compile_decode=args.compile, drafter=drafter, max_draft_tokens=args.draft_tokens,
                    cuda_graph=args.cuda_graph if cuda_graph is None else cuda_graph,
                    validate=getattr(args, "validate", "first"))
    total_steps = math.ceil(sum(len(r.prompt) for r in requests) / args.chunk) + args.decode - 1
    bar = ProgressBar(total_steps, enabled=progress and (args.progress or (sys.stderr.isatty() and total_steps > 20)))
    with OpTimer(synchronize=device.type == "cuda") as timer:
        finished = engine.run(requests, progress=lambda eng, batch: bar.advance())
    bar.close()
    return finished, engine, timer


def run(args) -> int:
    try:
        config = load_config(args.config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads expected an int >= 1, got {args.threads}", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    if not 0 <= args.draft_tokens <= 7:
        print(f"error: --draft-tokens expected an int in [0, 7], got {args.draft_tokens}", file=sys.stderr)
        return 2
    for name in ("batch", "prompt_len", "decode", "chunk", "block_tokens", "dcp"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} expected an int >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    try:
        with use_backend(args.backend) if args.backend else _active():
            return _run_on_backend(args, config)
    except (RegistryError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class _active:
    """The environment's (or automatic) backend, as a context like ``use_backend``."""

    def __enter__(self):
        return active_table()

    def __exit__(self, *exc):
        return False


def _run_on_backend(args, config) -> int:
    from ..model import LocalDsaAttention

    local = LocalDsaAttention(fused=not args.split_dsa)
    if args.dcp == 1:
        return _report(args, config, local, resolve_device(args), rank=0)
    from ..distributed import shutdown_distributed

    attention, context = start_dcp(args, config)
    try:
        device = context.device if context.device.type == "cuda" else resolve_device(args)
        return _report(args, config, attention, device, rank=context.rank, replay_attention=local)
    finally:
        shutdown_distributed()


def _report(args, config, attention, device, *, rank: int, replay_attention=None) -> int:
    """Run, replay on the reference with --check, print (rank 0 only) and write the JSON report."""
    from ..model import HybridModel, init_weights, load_weights

    table = active_table()
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    with torch.device("meta"):  # no default init: every parameter is drawn or loaded just below
        model = HybridModel(config)
    model = model.to_empty(device=device).to(dtype).eval()
    if args.weights:
        load_weights(model, args.weights)
    else:
        init_weights(model, seed=args.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    finished, engine, timer = execute(args, model, config, device, attention, progress=rank == 0)
    report = {
        "backend": table.name, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "config": config.to_dict(), "latent_fmt": args.latent_fmt, "index_fmt": args.index_fmt,
        "block_tokens": args.block_tokens, "batch": args.batch, "prompt_lengths": [len(r.prompt) for r in finished],
        "decode_tokens_per_request": args.decode, "seed": args.seed, "stats": vars(engine.stats) | {
            "prefill_tokens_per_s": engine.stats.prefill_tokens_per_s,
            "decode_tokens_per_s": engine.stats.decode_tokens_per_s},
        "ops": timer.rows(), "ops_seconds": timer.ops_seconds,
        "cache": {"rows": engine.cache.num_rows, "row_bytes": engine.cache.row_bytes,
                  "bytes": engine.cache.num_rows * engine.cache.row_bytes,
                  "state_slots": engine.cache.num_state_slots},
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "memory": peak_memory(device), "outputs": [r.output for r in finished], "dcp": args.dcp,
        "cuda_graph": engine.graphs is not None,
    }
    if rank != 0:
        return 0
    if args.check:  # single-device on the reference: the oracle for a DCP run as well
        with use_backend("reference"):  # eager: the reference reads values on the host, nothing to capture
            replay, _, _ = execute(args, model, config, device, replay_attention or attention,
                                   forced=[r.output for r in finished], progress=False, cuda_graph=False)
        report["check"] = compare_runs(finished, replay)
    print_report(report)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run the hybrid model: tokens/s, per-op times, --check vs reference",
                                   description=__doc__)
    parser.add_argument("--backend", default=None, help="backend name (default: DSAHAL_BACKEND or automatic)")
    parser.add_argument("--config", default="tiny", help="preset (tiny, k31-pro-slice, k31-pro) or a JSON file")
    parser.add_argument("--batch", type=int, default=4, help="requests in the batch (default 4)")
    parser.add_argument("--prompt-len", type=int, default=128, help="longest prompt; the others are shorter")
    parser.add_argument("--decode", type=int, default=32, help="tokens generated per request (default 32)")
    parser.add_argument("--check", action="store_true", help="replay on the reference backend and compare logits")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and sampling")
    parser.add_argument("--device", default=None, help="torch device (default: cuda for GPU backends, else cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="model dtype (default float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--latent-fmt", default="bf16", help="MLA latent cache format (default bf16)")
    parser.add_argument("--index-fmt", default="fp8", help="index-key cache format (default fp8)")
    parser.add_argument("--block-tokens", type=int, default=64, help="tokens per cache block (default 64)")
    parser.add_argument("--chunk", type=int, default=512, help="prompt tokens per prefill step (default 512)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: seeded sampling")
    parser.add_argument("--weights", default=None, help="load a .safetensors checkpoint instead of random weights")
    parser.add_argument("--split-dsa", action="store_true",
                        help="call indexer, top-k and sparse MLA separately instead of the fused dsa_attention")
    parser.add_argument("--compile", action="store_true", help="decode through torch.compile(fullgraph=True)")
    parser.add_argument("--validate", choices=("first", "always", "never"), default="first",
                        help="op argument checks (some read tensor values on the host): until one prefill and one "
                             "decode step have passed (default), on every step, or never")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay decode steps from CUDA graphs captured per batch size (CUDA only; capture "
                             "time is reported apart and not counted in decode tokens/s)")
    parser.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                        help="speculative decoding: verify up to K (<= 7) prompt-lookup drafts per request per "
                             "decode step (greedy only; default 0: off)")
    parser.add_argument("--dcp", type=int, default=1,
                        help="decode context parallelism over W processes started by torchrun (default 1)")
    parser.add_argument("--dcp-timeout", type=float, default=120.0,
                        help="seconds a DCP rank waits for its peers before failing (default 120)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's; 1 is fastest on a shared machine)")
    parser.add_argument("--progress", action="store_true", help="always draw the progress bar (default: long runs "
                                                                "on a terminal)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    parser.set_defaults(func=run)
