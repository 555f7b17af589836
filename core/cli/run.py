"""``dsahal run``: the hybrid model end to end on a backend — tokens/s, per-op times, peak memory, --check.

A batch of requests with different prompt lengths (request i has ``N - i·N/(2B)`` prompt tokens for
``--prompt-len N --batch B``) is prefilled in chunks and decoded ``--decode M`` tokens each over the
packed cache, on the selected backend. The header (backend, device, config, cache, requests, memory
estimate) is printed before anything is allocated, and the estimate is checked against the machine's
free memory; each phase (weights, compile, prefill, decode) shows its progress on stderr. On a GPU
backend the attention kernels are compiled before the first prefill by a warm-up that runs them on
dummy inputs on several threads at once (``--no-warmup`` skips it); the report says how long it took and
when the first token came, counted from the start of the process.

``--check`` replays the same requests on the reference backend, forced to emit the same tokens, and
compares the logits of every prompt position and every sampled position (under DCP: on every rank)
against a tolerance per dtype and cache format (README, ``dsahal.engine.check``). Exit status: 0;
1 when --check finds a difference beyond the tolerance; 2 for a usage error (bad argument, config,
device, or a run that would not fit in memory); 3 when the run fails (a DCP peer died, out of memory).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

from ..cache import DEFAULT_ROW_ROUNDING, ROW_ROUNDINGS, plan_layout
from ..config import list_presets, load_config
from ..registry import RegistryError, use_backend
from ..registry.state import active_table
from ..engine.check import check_tolerance, compare_runs, merge_rank_checks
from ..engine.memory import check_fits, estimate_run_memory
from ..engine.progress import PhaseProgress, process_age, say
from ..engine.prefill_sharding import (DEFAULT_MIN_TOKENS, MODES, check_sharding_args, prefill_sharding_line,
                                      prefill_sharding_report, start_tp)
from ..engine.report import peak_memory, print_header, print_results
from . import check_output_path

EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_FAILED = 1, 2, 3

FINGERPRINT_ARGS = ("backend", "batch", "prompt_len", "decode", "seed", "dtype", "latent_fmt", "index_fmt",
                    "block_tokens", "chunk", "temperature", "weights", "split_dsa", "draft_tokens", "fused_glue")
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
                                record_logits=args.check, record_prompt_logits=args.check))
    return requests


def resolve_device(args) -> torch.device:
    """``--device`` (checked: a CUDA device on a CPU build of torch is a usage error), else cuda for a GPU
    backend when CUDA is available, else cpu; ``--cuda-graph`` needs it to be a CUDA device (said before any
    weight is drawn). Raises ``ValueError`` naming the argument."""
    device = _device(args)
    if getattr(args, "cuda_graph", False) and device.type != "cuda":
        raise ValueError(f"dsahal run: argument '--cuda-graph' needs a CUDA device, the run's device is {device} "
                         f"(drop --cuda-graph, or run on a GPU with a GPU backend or --device cuda)")
    return device


def _device(args) -> torch.device:
    """:func:`resolve_device` without the ``--cuda-graph`` check."""
    if args.device:
        try:
            device = torch.device(args.device)
        except RuntimeError as exc:
            raise ValueError(f"dsahal run: argument '--device' expected a torch device such as cpu, cuda or "
                             f"cuda:1, got {args.device!r} ({exc})") from None
        if device.type == "meta":  # shapes only: the first op that reads values failed, naming its own 'q'
            raise ValueError(f"dsahal run: argument '--device {args.device}' expected a device that holds data "
                             f"(cpu, cuda, ...): the run computes real tokens")
        if device.type == "cuda":
            if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
                raise ValueError(f"dsahal run: argument '--device {args.device}': this torch ({torch.__version__}) "
                                 f"was built without CUDA; install a CUDA build of torch or use --device cpu")
            if not torch.cuda.is_available():
                raise ValueError(f"dsahal run: argument '--device {args.device}': torch sees no CUDA device "
                                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"dsahal run: argument '--device {args.device}': expected an index below "
                                 f"{torch.cuda.device_count()} (the visible CUDA devices)")
        return device
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


def execute(args, model, config, device, attention, *, forced=None, progress=True, cuda_graph=None, label=None,
            warmup: bool = False, clock: dict | None = None):
    """Run the requests once on the active backend; returns (finished requests, engine, op timer, warm-up).

    ``warmup``: run the compile warm-up (:mod:`dsahal.engine.warmup`) before the first step unless
    ``--no-warmup``; the last item is its :class:`~dsahal.engine.warmup.WarmupResult` (None when not asked).
    ``clock``: gets ``"warmup"``, the ``time.perf_counter()`` when the cache is built and the warm-up (if
    any) is over.

    ``cuda_graph`` (default ``--cuda-graph``): replay decode steps from CUDA graphs. ``progress``: show
    the prefill and decode phases (and that compiling starts) on stderr; ``label``: one bar of that name
    for every step instead (the --check replay)."""
    from ..engine import Engine, OpTimer, build_cache
    from ..engine.speculative import prompt_lookup_drafter

    requests = make_requests(args, config.vocab_size, forced=forced)
    max_context = max(r.total_tokens for r in requests)
    cache = build_cache(config, max_batch=args.batch, max_context=max_context, latent_fmt=args.latent_fmt,
                        index_fmt=args.index_fmt, block_tokens=args.block_tokens, device=device,
                        context_shards=getattr(attention, "context_shards", 1), row_rounding=args.row_rounding)
    drafter = prompt_lookup_drafter(args.draft_tokens) if args.draft_tokens else None
    engine = Engine(model, cache, latent_fmt=args.latent_fmt, index_fmt=args.index_fmt, max_batch=args.batch,
                    max_context=max_context, prefill_chunk_tokens=args.chunk, attention=attention,
                    compile_decode=args.compile, drafter=drafter, max_draft_tokens=args.draft_tokens,
                    cuda_graph=args.cuda_graph if cuda_graph is None else cuda_graph,
                    validate=getattr(args, "validate", "first"))
    prefill_steps = math.ceil(sum(len(r.prompt) for r in requests) / args.chunk)
    live = True if args.progress else None  # None: a bar on a terminal, one line per phase elsewhere
    warmed = None
    if warmup:  # before the op timer: its calls are not the run's
        from ..engine.warmup import WarmupResult, warm_up

        warmed = WarmupResult(skipped="--no-warmup") if args.no_warmup else \
            warm_up(engine, [len(r.prompt) for r in requests], show=progress, live=live)
    if clock is not None:
        clock["warmup"] = time.perf_counter()
    if label:
        bars = {"all": PhaseProgress(label, prefill_steps + args.decode - 1, "steps", enabled=progress, live=live)}
    else:
        bars = {"prefill": PhaseProgress("prefill", prefill_steps, "steps", enabled=progress, live=live)}

    def advance(eng, batch):
        if label:
            bars["all"].advance()
            return
        if not batch.meta.decode and "decode" not in bars:
            bars["prefill"].advance()
            if not eng.waiting and not any(r.in_prefill for r in eng.running):  # the last prefill step
                bars["prefill"].close()
                if eng.running and args.compile:
                    say("compile  torch.compile(fullgraph=True) of the decode step: it compiles during the first "
                        "decode step (tens of seconds for a large model)", enabled=progress)
                if eng.running:
                    bars["decode"] = PhaseProgress("decode", args.decode - 1, "steps", enabled=progress, live=live)
        elif "decode" in bars:
            bars["decode"].advance()

    with OpTimer(synchronize=device.type == "cuda") as timer:
        finished = engine.run(requests, progress=advance)
    for bar in bars.values():
        bar.close()
    return finished, engine, timer, warmed


def _error(message: str, code: int, *, show: bool = True) -> int:
    if show:
        print(f"error: {message}", file=sys.stderr)
    return code


def run(args) -> int:
    entered = time.perf_counter()
    age = process_age()  # the interpreter's start-up and the imports so far (torch, dsahal) happened before this
    args.clock = {"origin": entered - age if age is not None else entered,
                  "origin_is": "process start" if age is not None else "the start of dsahal run", "run": entered}
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    # Argument errors are the same on every rank of a torchrun job: the first rank alone prints them (every rank
    # exits with the status). Errors of the run itself may be one rank's own and are printed where they happen.
    first_rank = os.environ.get("RANK", "0") in ("", "0")

    def usage(message: str) -> int:
        return _error(message, EXIT_USAGE, show=first_rank)

    if args.dcp == 1 and args.tp == 1 and world > 1:
        # Decision (README): W copies of one single-device job would print W reports of the same run.
        return usage(f"dsahal run: started as {world} processes (WORLD_SIZE={world}, e.g. by torchrun) without "
                     f"--dcp: each would run the whole job alone; pass --dcp {world} to share the context over the "
                     f"{world} processes, --tp {world} to share prefill attention, or start one process without "
                     f"torchrun")
    try:
        config = load_config(args.config)
    except ValueError as exc:
        return usage(str(exc))
    if args.threads is not None:
        if args.threads < 1:
            return usage(f"--threads expected an int >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if not 0 <= args.draft_tokens <= 7:
        return usage(f"--draft-tokens expected an int in [0, 7], got {args.draft_tokens}")
    for name in ("batch", "prompt_len", "decode", "chunk", "block_tokens", "dcp", "tp"):
        if getattr(args, name) < 1:
            return usage(f"--{name.replace('_', '-')} expected an int >= 1, got {getattr(args, name)}")
    # torch's generators take seeds in [-2^63, 2^64); request i samples from seed + i. Past it the error was torch's
    # own "Overflow when unpacking long long", naming no flag.
    if not -2**63 <= args.seed <= 2**64 - args.batch:
        return usage(f"--seed expected an int in [-2^63, 2^64 - --batch] = [{-2**63}, {2**64 - args.batch}] (request i "
                     f"samples from seed + i), got {args.seed}")
    if args.check_tolerance is not None and not 0 < args.check_tolerance < float("inf"):
        return usage(f"--check-tolerance expected a number > 0, got {args.check_tolerance}")
    if not 0 <= args.temperature < float("inf"):  # before the header and the weights, not at the first request
        return usage(f"--temperature expected a finite number >= 0 (0: greedy), got {args.temperature}")
    if not 0 < args.dcp_timeout < float("inf"):  # 0, < 0, nan or inf became a torch traceback at the store
        return usage(f"--dcp-timeout expected a finite number of seconds > 0, got {args.dcp_timeout}")
    if args.json and first_rank:  # the report is written after the whole run: a bad path must not cost the run
        try:
            check_output_path(args.json)
        except ValueError as exc:
            return usage(f"dsahal run: argument '--json': {exc}")
    from ..distributed import DistributedFault

    try:
        with use_backend(args.backend) if args.backend else _active():
            return _run_on_backend(args, config)
    except (RegistryError, ValueError) as exc:  # MemoryEstimateError is a ValueError: nothing was allocated
        return _error(str(exc), EXIT_USAGE)
    except DistributedFault as exc:
        return _error(str(exc), EXIT_FAILED)
    except torch.OutOfMemoryError as exc:
        return _error(f"dsahal run: out of device memory despite the estimate; use a smaller --config, --batch, "
                      f"--prompt-len or --chunk ({str(exc).splitlines()[0]})", EXIT_FAILED)
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc) and "not enough memory" not in str(exc):
            raise
        return _error(f"dsahal run: out of CPU memory despite the estimate; use a smaller --config, --batch, "
                      f"--prompt-len or --chunk ({str(exc).splitlines()[0]})", EXIT_FAILED)


class _active:
    """The environment's (or automatic) backend, as a context like ``use_backend``."""

    def __enter__(self):
        return active_table()

    def __exit__(self, *exc):
        return False


def _run_on_backend(args, config) -> int:
    from ..model import fused

    if not args.fused_glue:
        return _run_attention(args, config)
    fused.enable_by_default(True)  # eager steps take the model's fused glue too (the warm-up then compiles it)
    try:
        return _run_attention(args, config)
    finally:
        fused.enable_by_default(False)


def _run_attention(args, config) -> int:
    from ..model import LocalDsaAttention

    local = LocalDsaAttention(fused=not args.split_dsa)
    check_sharding_args(args.prefill_sharding, args.prefill_shard_min_tokens, args.tp, args.dcp)
    if args.dcp == 1 and args.tp == 1:
        return _report(args, config, local, resolve_device(args), rank=0, world=1)
    from ..distributed import shutdown_distributed

    try:
        attention, context = (start_tp(args, config, {"config": json.dumps(config.to_dict(), sort_keys=True),
                                                      **{name: getattr(args, name) for name in FINGERPRINT_ARGS}})
                              if args.tp > 1 else start_dcp(args, config))
        device = context.device if context.device.type == "cuda" else resolve_device(args)
        return _report(args, config, attention, device, rank=context.rank, world=context.world_size,
                       replay_attention=local)
    finally:
        shutdown_distributed()


def _plan(args, config, device, dtype, context_shards: int):
    """The header's facts and the memory estimate, computed without allocating anything."""
    from ..engine import cache_rows_needed
    from ..model.checkpoint import checkpoint_bytes

    lengths = prompt_lengths(args.batch, args.prompt_len)
    max_context = max(lengths) + args.decode - 1
    layout = plan_layout(config, latent_fmt=args.latent_fmt, index_fmt=args.index_fmt,
                         block_tokens=args.block_tokens, dcp=context_shards, row_rounding=args.row_rounding)
    rows = cache_rows_needed(layout, max_batch=args.batch, max_context=max_context, context_shards=context_shards)
    estimate = estimate_run_memory(
        config, dtype=dtype, device=device, cache_bytes=rows * layout.row_bytes,
        tokens_per_step=min(args.chunk, sum(lengths)), max_context=max_context,
        sampled_rows=args.batch * (1 + args.draft_tokens),
        check_positions=(sum(lengths) + args.batch * args.decode) if args.check else 0,
        checkpoint_bytes=checkpoint_bytes(args.weights) if args.weights and os.path.exists(args.weights) else 0)
    return {"prompt_lengths": lengths, "cache": {"rows": rows, "row_bytes": layout.row_bytes,
                                                  "bytes": rows * layout.row_bytes,
                                                  "state_slots": rows // layout.rows_per_state
                                                  if layout.rows_per_state else 0},
            "memory_estimate": estimate.to_dict()}, estimate


def _load_model(args, config, device, dtype, show: bool):
    """The model in ``dtype`` on ``device`` (allocated once, in that dtype), weights drawn or loaded."""
    from ..model import HybridModel, init_weights
    from ..model.checkpoint import load_any
    from ..model.meta import materialize, on_meta

    with on_meta():  # no default init, and no fp32 copy: parameters are made in dtype below
        model = HybridModel(config).to(dtype)
    model = materialize(model, device).eval()
    tensors = len(list(model.parameters()))
    live = True if args.progress else None
    if args.weights:
        bar = PhaseProgress("weights", len(model.state_dict()), f"tensors loaded from {args.weights}",
                            enabled=show, live=live)
        load_any(model, args.weights, progress=lambda name: bar.advance())
    else:
        bar = PhaseProgress("weights", tensors, f"tensors drawn (seed {args.seed})", enabled=show, live=live)
        init_weights(model, seed=args.seed, progress=lambda name: bar.advance())
    bar.close()
    return model


def _report(args, config, attention, device, *, rank: int, world: int, replay_attention=None) -> int:
    """Header, run, --check (on every rank under DCP), results (rank 0 prints) and the JSON report."""
    table = active_table()
    show = rank == 0
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    dtype_name = str(dtype).replace("torch.", "")
    tolerance = args.check_tolerance if args.check_tolerance is not None else (
        check_tolerance(dtype_name, args.latent_fmt, args.index_fmt) if args.check else None)
    report = {
        "backend": table.name, "device": str(device), "dtype": dtype_name, "config": config.to_dict(),
        "latent_fmt": args.latent_fmt, "index_fmt": args.index_fmt, "block_tokens": args.block_tokens,
        "row_rounding": args.row_rounding, "batch": args.batch, "decode_tokens_per_request": args.decode,
        "seed": args.seed, "dcp": args.dcp, "weights": args.weights, "draft_tokens_per_step": args.draft_tokens,
        "fused_glue": bool(args.fused_glue),
    }
    facts, estimate = _plan(args, config, device, dtype, getattr(attention, "context_shards", 1))
    report |= facts
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if device.type == "cpu" else 1
    try:
        if not args.no_memory_check:
            report["memory_estimate"] |= check_fits(estimate, device, processes=processes)
    finally:  # the header comes first, also when the estimate does not fit (the error line follows)
        if show:
            print_header(report)
    clock = dict(getattr(args, "clock", None) or {"origin": time.perf_counter(), "origin_is": "the header"})
    clock["header"] = time.perf_counter()
    model = _load_model(args, config, device, dtype, show)
    clock["weights"] = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    finished, engine, timer, warmed = execute(args, model, config, device, attention, progress=show, warmup=True,
                                              clock=clock)
    clock["first_token"] = engine.stats.first_token_at
    report["warmup"] = warmed.to_dict()
    report["startup"] = _startup(clock)
    report |= prefill_sharding_report(attention)  # --tp: which prefill steps were token-sharded
    report |= {
        "prompt_lengths": [len(r.prompt) for r in finished],
        "stats": vars(engine.stats) | {"prefill_tokens_per_s": engine.stats.prefill_tokens_per_s,
                                       "decode_tokens_per_s": engine.stats.decode_tokens_per_s},
        "ops": timer.rows(), "ops_seconds": timer.ops_seconds,
        "cache": {"rows": engine.cache.num_rows, "row_bytes": engine.cache.row_bytes,
                  "bytes": engine.cache.num_rows * engine.cache.row_bytes, "state_slots": engine.cache.num_state_slots},
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "memory": peak_memory(device), "outputs": [r.output for r in finished],
        "cuda_graph": engine.graphs is not None,
    }
    if args.check:  # single-device on the reference: the oracle for a DCP run as well, on every rank
        with use_backend("reference"):  # eager: the reference reads values on the host, nothing to capture
            replay, _, _, _ = execute(args, model, config, device, replay_attention or attention,
                                   forced=[r.output for r in finished], progress=show, cuda_graph=False,
                                   label="check")
        check = compare_runs(finished, replay, tolerance=tolerance)
        if world > 1:
            check = merge_rank_checks(_gather_checks(check, world))
        # one process on the reference compared with the reference: the engine's repeatability is checked,
        # no backend is (the line says so rather than read as a backend's pass)
        check["backend_under_test"] = None if table.name == "reference" and world == 1 else table.name
        report["check"] = check
    if not show:
        return EXIT_CHECK_FAILED if args.check and not report["check"]["passed"] else 0
    print_results(report)
    if prefill_sharding_line(report):
        print(prefill_sharding_line(report))
    if args.json:
        try:
            with open(args.json, "w") as handle:
                json.dump(report, handle, indent=2)
        except OSError as exc:  # checked before the run; the path changed since (removed, filled up)
            return _error(f"dsahal run: argument '--json': cannot write {args.json!r} ({exc.strerror or exc})",
                          EXIT_FAILED)
    if args.check and not report["check"]["passed"]:
        check = report["check"]
        return _error(f"dsahal run --check: backend {table.name!r} differs from the reference by "
                      f"{check['relative_logit_diff']:.2e} of the largest |logit| (max |logit difference| "
                      f"{check['max_abs_logit_diff']:.3e} at {check['where']}), beyond the tolerance "
                      + (f"{check['tolerance']:.1e} (--check-tolerance)" if args.check_tolerance is not None else
                         f"{check['tolerance']:.1e} for {dtype_name} with {args.latent_fmt} latents and "
                         f"{args.index_fmt} index keys (README, 'dsahal run'; --check-tolerance overrides it)"),
                      EXIT_CHECK_FAILED)
    return 0


def _startup(clock: dict) -> dict:
    """Seconds from the origin (the process's start where readable) to each milestone of the run: ``run``
    (interpreter start-up and imports), ``header``, ``weights``, ``warmup`` (its end; the cache is built
    just before it) and ``first_token`` (None when no token was generated)."""
    origin = clock["origin"]
    out = {"origin": clock["origin_is"]}
    for name in ("run", "header", "weights", "warmup", "first_token"):
        if name in clock:
            out[f"{name}_s"] = None if clock[name] is None else clock[name] - origin
    return out


def _gather_checks(check: dict, world: int) -> list[dict]:
    """Every rank's --check result, on every rank (a small dict each)."""
    import torch.distributed as dist

    from ..distributed.collective import collective_step

    gathered = [None] * world
    with collective_step("dsahal run --check: gathering every rank's comparison"):
        dist.all_gather_object(gathered, check)
    return gathered


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run the hybrid model: tokens/s, per-op times, --check vs reference",
                                   description=__doc__)
    parser.add_argument("--backend", default=None, help="backend name (default: DSAHAL_BACKEND or automatic)")
    parser.add_argument("--config", default="tiny",
                        help=f"preset ({', '.join(list_presets())}; default %(default)s) or a JSON file")
    parser.add_argument("--batch", type=int, default=4, help="requests in the batch (default 4)")
    parser.add_argument("--prompt-len", type=int, default=128, help="longest prompt; the others are shorter")
    parser.add_argument("--decode", type=int, default=32, help="tokens generated per request (default 32)")
    parser.add_argument("--check", action="store_true",
                        help="replay on the reference backend and compare the logits of every prompt and sampled "
                             "position; exit 1 beyond the tolerance of the dtype and cache formats (README)")
    parser.add_argument("--check-tolerance", type=float, default=None, metavar="REL",
                        help="--check's limit on max |logit difference| / max |logit| (default: per dtype and "
                             "format, see README)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and sampling")
    parser.add_argument("--device", default=None, help="torch device (default: cuda for GPU backends, else cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="model dtype (default float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--latent-fmt", default="bf16", help="MLA latent cache format (default bf16)")
    parser.add_argument("--index-fmt", default="fp8", help="index-key cache format (default fp8)")
    parser.add_argument("--block-tokens", type=int, default=64, help="tokens per cache block (default 64)")
    parser.add_argument("--row-rounding", default=DEFAULT_ROW_ROUNDING, choices=ROW_ROUNDINGS,
                        help="cache rows rounded to whole 256-B pages (default) or to a power of two (only for "
                             "consumers that need power-of-two buffers; docs/cache.md)")
    parser.add_argument("--chunk", type=int, default=512, help="prompt tokens per prefill step (default 512)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: seeded sampling")
    parser.add_argument("--weights", default=None, help="load a .safetensors checkpoint (ours), or a public-layout checkpoint directory "
                        "or its model.safetensors.index.json, instead of random weights")
    parser.add_argument("--split-dsa", action="store_true",
                        help="call indexer, top-k and sparse MLA separately instead of the fused dsa_attention")
    parser.add_argument("--compile", action="store_true", help="decode through torch.compile(fullgraph=True)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the compile warm-up (GPU backends: the attention kernels run once on dummy inputs, "
                             "several compiling at once, before the first prefill); kernels then compile on first use")
    parser.add_argument("--validate", choices=("first", "always", "never"), default="first",
                        help="op argument checks (some read tensor values on the host): until one prefill and one "
                             "decode step have passed (default), on every step, or never")
    parser.add_argument("--fused-glue", action="store_true",
                        help="eager steps run the model's norms, gates, activations and RoPE as fused Triton kernels "
                             "too (CUDA; --cuda-graph replays always do): faster eager decode, ~10 s more compiling "
                             "before the first token on a fresh machine")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay decode steps from CUDA graphs captured per batch size (CUDA only; capture "
                             "time is reported apart and not counted in decode tokens/s)")
    parser.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                        help="speculative decoding: verify up to K (<= 7) prompt-lookup drafts per request per "
                             "decode step (greedy only; default 0: off)")
    parser.add_argument("--dcp", type=int, default=1,
                        help="decode context parallelism over W processes started by torchrun (default 1)")
    parser.add_argument("--tp", type=int, default=1,
                        help="W processes started by torchrun holding replicated caches (the TP case): prefill "
                             "attention is split over them by head or by token (--prefill-sharding); the other "
                             "layers run whole on every rank (default 1)")
    parser.add_argument("--prefill-sharding", choices=MODES, default="auto",
                        help="under --tp: token-shard every prefill step's DSA attention (tokens), none (head-"
                             "sharded), or those of >= --prefill-shard-min-tokens tokens (auto, default)")
    parser.add_argument("--prefill-shard-min-tokens", type=int, default=DEFAULT_MIN_TOKENS, metavar="N",
                        help=f"--prefill-sharding auto's threshold in tokens per step (default {DEFAULT_MIN_TOKENS})")
    parser.add_argument("--dcp-timeout", type=float, default=120.0,
                        help="seconds a DCP rank waits for its peers before failing (default 120)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's; 1 is fastest on a shared machine)")
    parser.add_argument("--progress", action="store_true",
                        help="draw each phase's bar in place even when stderr is not a terminal (default: bars on a "
                             "terminal, one line per phase elsewhere)")
    parser.add_argument("--no-memory-check", action="store_true",
                        help="start even when the memory estimate exceeds what the machine has free")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    parser.set_defaults(func=run)
