"""PyTorch training anchors for zerotrain's benchmarks (GPT-2, random tokens).

Run with torchrun (distributed modes) or plain python (single, hf):

  torchrun --nproc_per_node 2 bench/anchors/train_anchor.py --mode fsdp2 --model gpt2-large \
      --micro-batch 8 --seq 1024 --steps 20 --warmup 3 --dtype bf16 --json OUT.jsonl

Modes (see README.md for the ZeRO mapping):
  single         1 process, no torch.distributed; plain model, autocast bf16, fused AdamW
  hf             1 process; transformers GPT2LMHeadModel (sdpa), autocast bf16, fused AdamW
  ddp            DDP(bucket_cap_mb=25), fp32 params + autocast bf16            (~ ZeRO-0)
  zero1          ZeroRedundancyOptimizer(AdamW) + DDP, fp32 params + autocast  (~ ZeRO-1)
  fsdp2          fully_shard per block + root, reshard_after_forward=False    (~ ZeRO-2)
  fsdp2_reshard  reshard_after_forward=True                                   (~ ZeRO-3)
  fsdp2_offload  reshard_after_forward=True + CPUOffloadPolicy(pin_memory)    (~ ZeRO-3 + offload)
  compile        torch.compile(model) (DDP around it at world > 1), autocast bf16, fused AdamW
  deepspeed      DeepSpeed's engine (deepspeed.initialize), bf16, ZeRO stage --ds-stage, optimizer
                 AdamW (DeepSpeed's FusedAdam; DeepSpeedCPUAdam with --ds-offload), as DeepSpeed
                 users run it; needs the deepspeed package
FSDP2 modes use MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) instead of autocast.

Shape overrides (like zerotrain's CLI): --layers/--embd/--heads replace those of the named --model
(vocab, n_positions, default seq stay).  --checkpoint-activations recomputes each block in backward
(torch.utils.checkpoint, use_reentrant=False; hf: gradient_checkpointing_enable).  --meta-init (FSDP2
modes) builds the model on the meta device, shards it, materializes the shards with to_empty (on CPU for
fsdp2_offload, as CPUOffloadPolicy requires) and fills them with the same values the eager build would
give (same RNG stream, replayed on the compute device), so no full unsharded copy is ever allocated.

Rank 0 prints one JSON line on stdout and appends it to --json. Out-of-memory on any rank is a
result: {"status": "oom", "phase": ...}, exit code 0.
"""

import os

# NVLink multicast (NVLS) stays off in every process, before torch/NCCL initialize anything.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse
import contextlib
import datetime
import json
import math
import resource
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_env import torch_cuda_arch_for_deepspeed  # noqa: E402
from gpt2 import GPT2, CONFIGS, GPTConfig, cross_entropy_loss, flops_per_token, get_config, num_params  # noqa: E402

MODES = ("single", "hf", "ddp", "zero1", "fsdp2", "fsdp2_reshard", "fsdp2_offload", "compile", "deepspeed")
DIST_MODES = ("ddp", "zero1", "fsdp2", "fsdp2_reshard", "fsdp2_offload", "compile", "deepspeed")
ZERO_EQUIV = {
    "single": "single GPU (no sharding)",
    "hf": "single GPU (no sharding), HF transformers model",
    "ddp": "ZeRO-0 (DDP all-reduce)",
    "zero1": "ZeRO-1 (optimizer state sharded)",
    "fsdp2": "~ZeRO-2 (FSDP2 reshard_after_forward=False)",
    "fsdp2_reshard": "~ZeRO-3 (FSDP2 reshard_after_forward=True)",
    "fsdp2_offload": "~ZeRO-3 + offload (FSDP2 + CPUOffloadPolicy, torch AdamW on CPU)",
    "compile": "ZeRO-0 (torch.compile'd model; DDP at world > 1)",
    "deepspeed": "DeepSpeed ZeRO (stage and offload as given)",
}
PHASES = ("forward", "backward", "step")
GIB = float(1 << 30)
OOM_KEY = "zerotrain_anchor_oom"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--model", default="gpt2", choices=list(CONFIGS))
    p.add_argument("--layers", type=int, default=None, help="override n_layer of --model")
    p.add_argument("--embd", type=int, default=None, help="override n_embd of --model")
    p.add_argument("--heads", type=int, default=None, help="override n_head of --model")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="activation checkpointing: recompute each transformer block in backward")
    p.add_argument("--meta-init", action="store_true",
                   help="FSDP2 modes: build on the meta device, fully_shard, to_empty (cpu for fsdp2_offload), "
                        "then initialize the shards (same values as the eager build)")
    p.add_argument("--host-mem-guard-gib", type=float, default=None, metavar="GIB",
                   help="watch host memory (MemAvailable, and the cgroup limit if any) every 0.1 s; below GIB "
                        "report {status: oom, oom_kind: host} and exit before the kernel's OOM killer strikes "
                        "(default: off; any value also records host_min_avail_gib)")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per GPU per step")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's seq)")
    p.add_argument("--steps", type=int, default=20, help="timed iterations (after warm-up)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up iterations")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"),
                   help="compute dtype; master weights/optimizer are always fp32")
    p.add_argument("--json", default=None, help="append the result line to this file (rank 0)")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"),
                   help="default: cuda if available (cpu = gloo, for testing)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="per-GPU peak for MFU (default 989 = H100/H200 SXM dense bf16)")
    p.add_argument("--flops-n", default="all", choices=("all", "non_embedding"),
                   help="N in flops_per_token = 6N + 12*L*C*seq: all parameters (wte once; default) or "
                        "without wpe (nanoGPT; what src/models/gpt2.cpp uses)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size (ddp, zero1)")
    p.add_argument("--optim-impl", default="auto", choices=("auto", "fused", "foreach"),
                   help="AdamW implementation; auto = fused (falls back to foreach if fused is refused)")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch CPU threads per rank (default: for fsdp2_offload, cores / local ranks, since "
                        "torchrun sets OMP_NUM_THREADS=1 and the AdamW step runs on the CPU; otherwise unchanged)")
    p.add_argument("--no-phase-sync", action="store_true",
                   help="do not synchronize between phases (only at the end of each iteration); "
                        "phase times then come from CUDA events only")
    p.add_argument("--ds-stage", type=int, default=0, choices=(0, 1, 2, 3), help="deepspeed: ZeRO stage")
    p.add_argument("--ds-offload", default="none", choices=("none", "optimizer", "all"),
                   help="deepspeed: offload_optimizer cpu (optimizer), + offload_param cpu (all, stage 3)")
    p.add_argument("--ds-optimizer", default="fused", choices=("fused", "torch"),
                   help="deepspeed: its own FusedAdam/DeepSpeedCPUAdam (fused, DeepSpeed's default) or "
                        "torch.optim.AdamW (torch_adam: true)")
    p.add_argument("--simulate-oom", default=None, metavar="PHASE[:RANK[:ITER]]",
                   help="testing: raise torch.OutOfMemoryError in PHASE (setup|forward|backward|step) "
                        "on RANK (default all) at iteration ITER (default 0)")
    a = p.parse_args(argv)
    return a


# ----------------------------------------------------------------------------------------------
# OOM handling across ranks.  A rank that runs out of memory records the first OOM in the c10d
# store and exits; the other ranks may be blocked inside a collective that will never complete,
# so a watchdog thread polls the store and ends them.  Rank 0 always writes the result line.
# ----------------------------------------------------------------------------------------------
class Reporter:
    def __init__(self, args, base: dict, rank: int):
        self.args, self.base, self.rank = args, base, rank
        self.lock = threading.Lock()
        self.emitted = False

    def emit(self, record: dict) -> None:
        with self.lock:
            if self.emitted or self.rank != 0:
                return
            self.emitted = True
            line = json.dumps(record)
            print(line, flush=True)
            if self.args.json:
                d = os.path.dirname(os.path.abspath(self.args.json))
                os.makedirs(d, exist_ok=True)
                with open(self.args.json, "a") as f:
                    f.write(line + "\n")
                    f.flush()
                    os.fsync(f.fileno())

    def emit_oom(self, info: dict) -> None:
        rec = dict(self.base)
        rec.update(status="oom", phase=info.get("phase"), oom_kind=info.get("kind"), oom_rank=info.get("rank"),
                   oom_iteration=info.get("iteration"), error=info.get("error"))
        if "host_min_avail_gib" in info:
            rec["host_min_avail_gib"] = info["host_min_avail_gib"]
        self.emit(rec)


class OOMWatch:
    def __init__(self, reporter: Reporter, store, rank: int):
        self.reporter, self.store, self.rank = reporter, store, rank
        self.stop = threading.Event()
        self.thread = None
        if store is not None:
            self.thread = threading.Thread(target=self._run, name="oom-watch", daemon=True)
            self.thread.start()

    def peer_oom(self):
        """The first OOM recorded by another rank, or None."""
        if self.store is None:
            return None
        try:
            if not self.store.check([OOM_KEY]):
                return None
            info = json.loads(self.store.get(OOM_KEY).decode())
        except Exception:
            return None
        return None if info.get("rank") == self.rank else info

    def exit_for_peer(self, info):
        print(f"[rank {self.rank}] rank {info.get('rank')} ran out of memory in {info.get('phase')}; exiting",
              file=sys.stderr, flush=True)
        self.reporter.emit_oom(info)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _run(self):
        # NCCL ranks blocked in a collective whose peer has left never return: end them from here.
        while not self.stop.wait(0.25):
            try:
                self.store.check([OOM_KEY])
            except Exception:
                return  # store gone (the run is over): stop watching
            info = self.peer_oom()
            if info is not None:
                self.exit_for_peer(info)

    def failed(self, where: dict, exc: BaseException):
        """Called for any exception escaping the run. Returns only if it is neither our OOM nor a peer's."""
        if is_oom(exc):
            self.oom(where["phase"], where["iteration"], exc)
        # A transport error right after a peer's OOM (gloo sees the closed socket at once): wait briefly
        # for the peer's record in the store.
        deadline = time.time() + 3.0
        while self.store is not None and time.time() < deadline:
            info = self.peer_oom()
            if info is not None:
                self.exit_for_peer(info)
            time.sleep(0.1)

    def oom(self, phase: str, iteration, exc: BaseException, kind=None, extra=None):
        if kind is None:
            kind = oom_kind(exc)
        info = {"phase": phase, "iteration": iteration, "rank": self.rank, "kind": kind,
                "error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]}
        info.update(extra or {})
        print(f"[rank {self.rank}] out of memory in {phase} (iteration {iteration}): {info['error']}",
              file=sys.stderr, flush=True)
        if self.store is not None:
            try:  # first OOM wins; compare_set returns the value in force
                info = json.loads(self.store.compare_set(OOM_KEY, "", json.dumps(info)).decode())
            except Exception:
                pass
        self.reporter.emit_oom(info)
        # Other ranks may be stuck in collectives; give their watchdogs a moment to see the record
        # (so they report the OOM rather than a lost peer), then leave without tearing down NCCL.
        sys.stdout.flush()
        sys.stderr.flush()
        if self.store is not None:
            time.sleep(1.0)
        os._exit(0)

    def close(self):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2)


class HostMemMonitor:
    """Polls the host memory still available to this process (MemAvailable, capped by the cgroup's
    limit minus its non-reclaimable usage when a limit is set) and records the minimum.  With a guard
    it reports an out-of-memory result (oom_kind "host") and exits when the available memory drops
    below the guard: the kernel's OOM killer would otherwise SIGKILL the process with no result line.
    The guard acts only from this rank's view (ranks of one host see the same memory)."""

    def __init__(self, guard_gib, watch, where, period=0.1):
        self.guard_gib, self.watch, self.where, self.period = guard_gib, watch, where, period
        self.min_avail_gib = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="host-mem", daemon=True)
        self.thread.start()

    @staticmethod
    def _read_int(path):
        try:
            with open(path) as f:
                v = f.read().strip()
            return None if v in ("", "max") else int(v)
        except (OSError, ValueError):
            return None

    @classmethod
    def available_gib(cls):
        avail = None
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        avail = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
        # cgroup v2, then v1: limit - (usage - inactive file pages)
        for lim_p, use_p, stat_p, key in (
                ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
                 "inactive_file"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")):
            lim, use = cls._read_int(lim_p), cls._read_int(use_p)
            if lim is None or use is None or lim >= (1 << 60):
                continue
            inactive = 0
            try:
                with open(stat_p) as f:
                    for line in f:
                        k, v = line.split()[:2]
                        if k == key:
                            inactive = int(v)
                            break
            except (OSError, ValueError):
                pass
            cg = lim - (use - inactive)
            avail = cg if avail is None else min(avail, cg)
            break
        return None if avail is None else avail / GIB

    def _run(self):
        while not self.stop.wait(self.period):
            a = self.available_gib()
            if a is None:
                return
            if self.min_avail_gib is None or a < self.min_avail_gib:
                self.min_avail_gib = a
            if self.guard_gib and a < self.guard_gib:
                exc = MemoryError(f"host memory: {a:.2f} GiB available < --host-mem-guard-gib {self.guard_gib:g}")
                self.watch.oom(self.where.get("phase"), self.where.get("iteration"), exc, kind="host",
                               extra={"host_min_avail_gib": round(a, 3)})

    def close(self):
        self.stop.set()
        self.thread.join(timeout=2)


def oom_kind(exc: BaseException):
    """"device" (the CUDA caching allocator: torch.OutOfMemoryError), "host" (MemoryError, std::bad_alloc,
    DefaultCPUAllocator "can't allocate memory"), "cuda_error" (a RuntimeError "CUDA error: out of memory",
    i.e. cudaErrorMemoryAllocation from a driver call such as cudaHostAlloc when pinning host memory),
    or None if exc is not an out-of-memory error."""
    if isinstance(exc, torch.OutOfMemoryError):
        return "device"
    if isinstance(exc, MemoryError):
        return "host"
    if not isinstance(exc, RuntimeError):
        return None
    msg = str(exc).lower()
    if any(k in msg for k in ("can't allocate memory", "cannot allocate memory", "bad_alloc")):
        return "host"
    if "out of memory" in msg:
        return "cuda_error" if "cuda error" in msg else "device"
    return None


def is_oom(exc: BaseException) -> bool:
    return oom_kind(exc) is not None


class SimulatedOOM:
    def __init__(self, spec, rank):
        self.phase = self.rank = self.iteration = None
        if spec:
            parts = spec.split(":")
            self.phase = parts[0]
            self.rank = int(parts[1]) if len(parts) > 1 and parts[1] != "" else None
            self.iteration = int(parts[2]) if len(parts) > 2 else 0
        self.my_rank = rank

    def maybe(self, phase, iteration):
        if (self.phase == phase and (self.rank is None or self.rank == self.my_rank)
                and (phase == "setup" or iteration == self.iteration)):
            raise torch.OutOfMemoryError(f"simulated OOM in {phase} (--simulate-oom)")


# ----------------------------------------------------------------------------------------------
# Model / optimizer construction
# ----------------------------------------------------------------------------------------------
def build_hf_model(cfg: GPTConfig, device):
    try:
        import transformers
        from transformers import AutoModelForCausalLM, GPT2Config
    except ImportError as e:
        raise SystemExit(f"--mode hf needs transformers: {e}")
    tok = min(50256, cfg.vocab_size - 1)
    hc = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                    n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=None, activation_function="gelu_new",
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                    initializer_range=0.02, use_cache=False, tie_word_embeddings=True,
                    bos_token_id=tok, eos_token_id=tok)
    with torch.device(device):  # initialize directly on the target device
        model = AutoModelForCausalLM.from_config(hc, attn_implementation="sdpa")
    model = model.to(device=device, dtype=torch.float32)
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "sdpa":
        raise SystemExit(f"HF GPT-2 attention implementation is {impl!r}, wanted 'sdpa'")
    n = sum(p.numel() for p in model.parameters())
    if n != num_params(cfg):
        print(f"warning: HF model has {n} parameters, ours {num_params(cfg)}", file=sys.stderr)
    return model, f"transformers {transformers.__version__} GPT2LMHeadModel (sdpa)"


def make_adamw(params, args, device_type):
    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    if args.optim_impl in ("auto", "fused"):
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "AdamW(fused)"
        except (RuntimeError, ValueError) as e:
            if args.optim_impl == "fused":
                raise
            print(f"fused AdamW refused ({e}); using foreach", file=sys.stderr)
    return torch.optim.AdamW(params, foreach=True, **kw), "AdamW(foreach)"


def adamw_class_and_kwargs(args):
    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    if args.optim_impl == "foreach":
        kw["foreach"] = True
        return kw, "AdamW(foreach)"
    kw["fused"] = True
    return kw, "AdamW(fused)"


def apply_activation_checkpointing(model) -> None:
    """Recompute each transformer block in backward: the block's forward runs inside
    torch.utils.checkpoint.checkpoint(use_reentrant=False).  The wrapper replaces the block instance's
    forward, so module hooks (FSDP2's fully_shard of the block) stay outside the checkpointed region
    (as with torch's checkpoint_wrapper applied before fully_shard) and the module tree is unchanged."""
    import functools
    from torch.utils.checkpoint import checkpoint

    def ckpt_forward(inner, *a, **kw):
        return checkpoint(inner, *a, use_reentrant=False, **kw)

    for block in model.h:
        block.forward = functools.partial(ckpt_forward, block.forward)


def _eager_default_init_replay(model, gen_device) -> None:
    """Advance the RNG exactly as GPT2(cfg) does before its reset_parameters(): every nn.Linear and
    nn.Embedding runs its default init in construction (= module registration) order.  The values are
    discarded (reset_parameters overwrites them); only the generator state matters."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=gen_device)
        elif isinstance(m, torch.nn.Embedding):
            torch.nn.Embedding(m.num_embeddings, m.embedding_dim, device=gen_device)
        # LayerNorm's default init draws no random numbers


def _fill_param(param, value_fn, gen_device, rank, world) -> None:
    """Writes value_fn(full tensor on gen_device) into param, which may be an FSDP2 DTensor shard
    (Shard(dim), torch.chunk layout as fully_shard uses) or a plain tensor."""
    from torch.distributed.tensor import DTensor, Shard
    full = torch.empty(param.shape, dtype=param.dtype, device=gen_device)
    value_fn(full)
    if isinstance(param, DTensor):
        local = param._local_tensor
        (pl,) = param.placements
        if not isinstance(pl, Shard):
            raise RuntimeError(f"meta-init expects Shard placements, got {param.placements}")
        chunks = list(torch.chunk(full, world, dim=pl.dim))
        part = chunks[rank] if rank < len(chunks) else full.narrow(pl.dim, 0, 0)
        if part.shape != local.shape:
            raise RuntimeError(f"meta-init: shard shape {tuple(part.shape)} != local {tuple(local.shape)}")
        local.copy_(part)
    else:
        param.copy_(full)


@torch.no_grad()
def init_like_eager(model, cfg, gen_device, seed, rank, world) -> None:
    """Initializes a materialized (to_empty) GPT2, sharded or not, to exactly the weights that
    `torch.manual_seed(seed); with torch.device(gen_device): GPT2(cfg)` gives: the default-init RNG draws
    are replayed, then gpt2.py's reset_parameters() is done tensor by tensor on gen_device (one full
    tensor at a time) and each rank keeps its shard."""
    torch.manual_seed(seed)
    _eager_default_init_replay(model, gen_device)
    std = 0.02
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    fill = lambda p, fn: _fill_param(p, fn, gen_device, rank, world)  # noqa: E731
    for name, m in model.named_modules():  # same order and same calls as GPT2.reset_parameters
        if isinstance(m, torch.nn.Linear):
            s_ = proj_std if name.endswith("c_proj") else std
            fill(m.weight, lambda t, s_=s_: torch.nn.init.normal_(t, mean=0.0, std=s_))
            fill(m.bias, torch.nn.init.zeros_)
        elif isinstance(m, torch.nn.Embedding):
            fill(m.weight, lambda t: torch.nn.init.normal_(t, mean=0.0, std=std))
        elif isinstance(m, torch.nn.LayerNorm):
            fill(m.weight, torch.nn.init.ones_)
            fill(m.bias, torch.nn.init.zeros_)


def build(args, cfg, device, world, local_rank, where=None):
    """Returns (model, optimizer, use_autocast, notes dict)."""
    mode = args.mode
    notes = {}
    where = where if where is not None else {}
    torch.manual_seed(args.seed)  # same init on every rank
    meta = args.meta_init
    if mode == "hf":
        model, notes["model_impl"] = build_hf_model(cfg, device)
    else:
        with torch.device("meta" if meta else device):
            model = GPT2(cfg)
        notes["model_impl"] = "bench/anchors/gpt2.py"
    model.train()
    if args.checkpoint_activations:
        if mode == "hf":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            notes["activation_checkpointing"] = "HF gradient_checkpointing_enable(use_reentrant=False)"
        else:
            apply_activation_checkpointing(model)
            notes["activation_checkpointing"] = "torch.utils.checkpoint(use_reentrant=False) per block"

    bf16 = args.dtype == "bf16"
    if mode == "compile":
        model = torch.compile(model)
        notes["compile"] = "torch.compile(model) (default mode, inductor)"
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                        bucket_cap_mb=args.bucket_cap_mb)
            notes["ddp_bucket_cap_mb"] = args.bucket_cap_mb
        opt, notes["optimizer"] = make_adamw(model.parameters(), args, device.type)
        notes["precision"] = ("fp32 params + torch.autocast(bf16)" if bf16 else "fp32")
        return model, opt, bf16, notes
    if mode == "deepspeed":
        return build_deepspeed(args, model, device, world, notes)
    if mode in ("single", "hf"):
        opt, notes["optimizer"] = make_adamw(model.parameters(), args, device.type)
        notes["precision"] = ("fp32 params + torch.autocast(bf16)" if bf16 else "fp32")
        return model, opt, bf16, notes

    if mode in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                  bucket_cap_mb=args.bucket_cap_mb)
        if mode == "ddp":
            opt, notes["optimizer"] = make_adamw(ddp.parameters(), args, device.type)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            kw, name = adamw_class_and_kwargs(args)
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **kw)
            notes["optimizer"] = f"ZeroRedundancyOptimizer({name})"
        notes["precision"] = ("fp32 params + torch.autocast(bf16), fp32 gradient all-reduce" if bf16 else "fp32")
        notes["ddp_bucket_cap_mb"] = args.bucket_cap_mb
        return ddp, opt, bf16, notes

    # FSDP2
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    mesh = init_device_mesh(device.type, (world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())
    reshard = mode in ("fsdp2_reshard", "fsdp2_offload")
    offload = (CPUOffloadPolicy(pin_memory=(device.type == "cuda")) if mode == "fsdp2_offload"
               else OffloadPolicy())
    for block in model.h:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=offload)
    if meta:
        # CPUOffloadPolicy wants the sharded parameters on the CPU (FSDPParamGroup checks it at lazy
        # init); FSDPModule._apply re-registers (and, with pin_memory, pins) the shards after to_empty.
        mat_dev = torch.device("cpu") if mode == "fsdp2_offload" else device
        where["phase"] = "setup:materialize"
        t0 = time.perf_counter()
        model.to_empty(device=mat_dev)
        t1 = time.perf_counter()
        where["phase"] = "setup:init"
        rank = dist.get_rank() if dist.is_initialized() else 0
        init_like_eager(model, cfg, device, args.seed, rank, world)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        where["phase"] = "setup"
        notes["meta_init_info"] = {"materialize_device": str(mat_dev), "materialize_s": round(t1 - t0, 3),
                                   "init_s": round(t2 - t1, 3), "init_rng_device": str(device)}
    if device.type == "cuda":
        torch.cuda.empty_cache()  # drop the unsharded init copy from the cache
    opt, notes["optimizer"] = make_adamw(model.parameters(), args, device.type)
    if mode == "fsdp2_offload":
        notes["optimizer"] += " on CPU"
    notes["precision"] = ("fp32 sharded params, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)"
                          if bf16 else "fp32")
    notes["fsdp2"] = {"reshard_after_forward": reshard, "cpu_offload": mode == "fsdp2_offload",
                      "wrap": "fully_shard(each block), then fully_shard(root)"}
    # FSDP2 casts parameters itself: no autocast
    return model, opt, False, notes


def deepspeed_config(args, world):
    """The DeepSpeed config of the run: bf16 (or fp32), the ZeRO stage and offload of the row, AdamW
    with the anchors' hyperparameters, no clipping, no accumulation."""
    zero = {"stage": args.ds_stage}
    if args.ds_offload != "none":
        if args.ds_stage == 0:
            raise SystemExit("--ds-offload needs --ds-stage >= 1")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if args.ds_offload == "all":
        if args.ds_stage != 3:
            raise SystemExit("--ds-offload all needs --ds-stage 3")
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    params = {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if args.ds_optimizer == "torch":
        params.update(torch_adam=True, adam_w_mode=True)
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": args.micro_batch * world,
        "bf16": {"enabled": args.dtype == "bf16"},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": params},
        "gradient_clipping": 0.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def build_deepspeed(args, model, device, world, notes):
    changed = torch_cuda_arch_for_deepspeed(device)
    if changed:
        notes["torch_cuda_arch_list"] = f"{changed} (for DeepSpeed's op builder)"
    try:
        import deepspeed
    except ImportError as e:
        raise SystemExit(f"--mode deepspeed needs the deepspeed package: {e}")
    ds_cfg = deepspeed_config(args, world)
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    notes["deepspeed"] = {"version": deepspeed.__version__, "config": ds_cfg,
                          "optimizer_class": type(engine.optimizer).__name__,
                          "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__}
    notes["optimizer"] = f"DeepSpeed {ds_cfg['optimizer']['type']} ({args.ds_optimizer})"
    notes["precision"] = "DeepSpeed bf16 (bf16 params, fp32 master)" if args.dtype == "bf16" else "fp32"
    return engine, opt, False, notes


# ----------------------------------------------------------------------------------------------
# Timing helpers
# ----------------------------------------------------------------------------------------------
class PhaseClock:
    """Times the 3 phases of an iteration with CUDA events (cuda) or perf_counter (cpu)."""

    def __init__(self, device, phase_sync: bool):
        self.cuda = device.type == "cuda"
        self.phase_sync = phase_sync
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(len(PHASES) + 1)]
        self.t = [0.0] * (len(PHASES) + 1)
        self.mem = {}

    def start(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self.events[0].record()
        self.t[0] = time.perf_counter()

    def end_phase(self, i: int, name: str):
        """Call after phase i (0-based) has been issued."""
        if self.cuda:
            ev = self.events[i + 1]
            ev.record()
            if self.phase_sync or i == len(PHASES) - 1:
                ev.synchronize()
            self.mem[name] = {"after": torch.cuda.memory_allocated() / GIB,
                              "peak": torch.cuda.max_memory_allocated() / GIB,
                              "reserved": torch.cuda.max_memory_reserved() / GIB}
            torch.cuda.reset_peak_memory_stats()  # the next phase's peak starts here
        self.t[i + 1] = time.perf_counter()

    def result(self):
        wall = (self.t[-1] - self.t[0]) * 1e3
        if self.cuda:
            ms = [self.events[i].elapsed_time(self.events[i + 1]) for i in range(len(PHASES))]
        else:
            ms = [(self.t[i + 1] - self.t[i]) * 1e3 for i in range(len(PHASES))]
        return dict(zip(PHASES, ms)), wall, (dict(self.mem) if self.cuda else None)


def nccl_version():
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv=None):
    args = parse_args(argv)
    cfg = get_config(args.model)
    over = {k: v for k, v in (("n_layer", args.layers), ("n_embd", args.embd), ("n_head", args.heads))
            if v is not None}
    if over:
        import dataclasses
        if any(v < 1 for v in over.values()):
            raise SystemExit("--layers/--embd/--heads must be >= 1")
        tag = ",".join(f"{k}={over[n]}" for k, n in (("layers", "n_layer"), ("embd", "n_embd"), ("heads", "n_head"))
                       if n in over)
        cfg = dataclasses.replace(cfg, name=f"{cfg.name}[{tag}]", **over)
    if cfg.n_embd % cfg.n_head:
        raise SystemExit(f"n_embd {cfg.n_embd} is not divisible by n_head {cfg.n_head}")
    if args.meta_init and not args.mode.startswith("fsdp2"):
        raise SystemExit("--meta-init is for the FSDP2 modes (fsdp2, fsdp2_reshard, fsdp2_offload)")
    seq = args.seq or cfg.seq
    if seq > cfg.n_positions:
        raise SystemExit(f"--seq {seq} > n_positions {cfg.n_positions} of {cfg.name}")
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = args.mode in DIST_MODES
    if not distributed and world > 1:
        raise SystemExit(f"--mode {args.mode} is single-process; run it without torchrun or with --nproc_per_node 1")

    dev_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev_type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but CUDA is not available")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    if args.cpu_threads or args.mode == "fsdp2_offload" or (args.mode == "deepspeed" and args.ds_offload != "none"):
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(args.cpu_threads or max(1, len(os.sched_getaffinity(0)) // local_world))

    store = None
    if distributed and "RANK" not in os.environ:  # plain `python train_anchor.py --mode ddp`: 1-process group
        import socket
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if distributed:
        if dev_type == "cuda":
            backend = "cpu:gloo,cuda:nccl" if args.mode == "fsdp2_offload" else "nccl"
            dist.init_process_group(backend=backend, device_id=device)
        else:
            backend = "gloo"
            dist.init_process_group(backend=backend)
        world, rank = dist.get_world_size(), dist.get_rank()
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception as e:  # the watchdog is a convenience; run without it
            print(f"warning: no c10d store for the OOM watchdog ({e})", file=sys.stderr)
    else:
        backend = None

    base = {
        "framework": "deepspeed" if args.mode == "deepspeed" else "pytorch", "mode": args.mode, "zero_equiv": (ZERO_EQUIV[args.mode] if args.mode != "deepspeed" else
                       f"DeepSpeed ZeRO-{args.ds_stage}" + {"none": "", "optimizer": " + offload_optimizer cpu",
                                                            "all": " + offload_optimizer/param cpu"}[args.ds_offload]), "model": cfg.name,
        "world": world, "micro_batch": args.micro_batch, "seq": seq, "dtype": args.dtype,
        "steps": args.steps, "warmup": args.warmup, "device": device_name(device),
        "backend": backend, "torch": torch.__version__,
        "nccl": nccl_version() if dev_type == "cuda" else None,
        "n_params": num_params(cfg), "layers": cfg.n_layer, "embd": cfg.n_embd, "heads": cfg.n_head,
        "vocab": cfg.vocab_size, "checkpoint_activations": args.checkpoint_activations,
        "meta_init": args.meta_init, "flops_n": args.flops_n,
        "flops_per_token": flops_per_token(cfg, seq, exclude_wpe=args.flops_n == "non_embedding"),
        "peak_tflops": args.peak_tflops,
        "ds_stage": args.ds_stage if args.mode == "deepspeed" else None,
        "ds_offload": args.ds_offload if args.mode == "deepspeed" else None,
        "phase_sync": not args.no_phase_sync,
        "cpu_threads": torch.get_num_threads(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    reporter = Reporter(args, base, rank)
    watch = OOMWatch(reporter, store, rank)
    where = {"phase": "setup", "iteration": None}
    hostmon = HostMemMonitor(args.host_mem_guard_gib, watch, where) if args.host_mem_guard_gib is not None else None
    try:
        run(args, cfg, seq, device, world, rank, local_rank, distributed, base, reporter, where, hostmon)
    except BaseException as exc:
        watch.failed(where, exc)  # exits on our OOM or a peer's
        raise
    if hostmon is not None:
        hostmon.close()
    watch.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def run(args, cfg, seq, device, world, rank, local_rank, distributed, base, reporter, where, hostmon=None):
    dev_type = device.type
    sim = SimulatedOOM(args.simulate_oom, rank)

    # ---- setup --------------------------------------------------------------------------------
    sim.maybe("setup", None)
    model, opt, use_autocast, notes = build(args, cfg, device, world, local_rank, where)
    base.update(notes)

    n_iters = args.warmup + args.steps
    gen = torch.Generator().manual_seed(args.seed + rank)
    data = torch.randint(0, cfg.vocab_size, (n_iters, args.micro_batch, seq + 1), generator=gen)
    autocast = (lambda: torch.autocast(device_type=dev_type, dtype=torch.bfloat16)) if use_autocast \
        else contextlib.nullcontext
    hf = args.mode == "hf"
    ds = args.mode == "deepspeed"

    if dev_type == "cuda":
        torch.cuda.synchronize()
        init_gib = torch.cuda.memory_allocated() / GIB
    else:
        init_gib = None
    if distributed:
        dist.barrier()

    # ---- training loop ------------------------------------------------------------------------
    clock = PhaseClock(device, phase_sync=not args.no_phase_sync)
    records, losses = [], []
    for it in range(n_iters):
        batch = data[it].to(device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        where.update(phase="forward", iteration=it)
        clock.start()
        sim.maybe("forward", it)
        with autocast():
            if hf:
                loss = cross_entropy_loss(model(input_ids=inputs).logits, targets)
            else:
                loss = model(inputs, targets)
        clock.end_phase(0, "forward")
        where["phase"] = "backward"
        sim.maybe("backward", it)
        if ds:
            model.backward(loss)
        else:
            loss.backward()
        clock.end_phase(1, "backward")
        where["phase"] = "step"
        sim.maybe("step", it)
        if ds:
            model.step()  # DeepSpeed's step zeroes the gradients itself
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        clock.end_phase(2, "step")
        losses.append(loss.detach())
        ms, wall, mem = clock.result()
        records.append({"ms": ms, "wall": wall, "mem": mem})
        if rank == 0 and (it < 2 or it == n_iters - 1 or (it + 1) % 10 == 0):
            print(f"[{args.mode}] iter {it + 1}/{n_iters} loss {loss.item():.4f} "
                  f"fwd {ms['forward']:.1f} bwd {ms['backward']:.1f} step {ms['step']:.1f} ms",
                  file=sys.stderr, flush=True)

    # ---- aggregate ----------------------------------------------------------------------------
    where.update(phase="report", iteration=None)
    loss_vec = torch.stack([l.float() for l in losses]).to(device)
    if distributed:
        dist.all_reduce(loss_vec, op=dist.ReduceOp.SUM)
        loss_vec /= world
    loss_list = [round(float(x), 6) for x in loss_vec.cpu()]

    timed = records[args.warmup:]
    phase_ms = {p: sum(r["ms"][p] for r in timed) / len(timed) for p in PHASES}
    iter_ms = [sum(r["ms"].values()) for r in timed]
    ms_per_iter = sum(iter_ms) / len(iter_ms)
    wall_ms = sum(r["wall"] for r in timed) / len(timed)

    host_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB
    if dev_type == "cuda":
        # per rank: [fwd after, fwd peak, bwd after, bwd peak, step after, step peak, run peak, reserved, init, rss]
        vals = []
        for p in PHASES:
            vals += [timed[-1]["mem"][p]["after"], max(r["mem"][p]["peak"] for r in timed)]
        run_peak = max(r["mem"][p]["peak"] for r in records for p in PHASES)
        run_reserved = max(r["mem"][p]["reserved"] for r in records for p in PHASES)
        vals += [run_peak, run_reserved, init_gib, host_rss_gib]
        mem_t = torch.tensor(vals, dtype=torch.float64, device=device)
        per_rank_peak = [run_peak]
        if distributed:
            gathered = [torch.zeros_like(mem_t) for _ in range(world)]
            dist.all_gather(gathered, mem_t)
            per_rank_peak = [float(g[6]) for g in gathered]
            mem_t = torch.stack(gathered).max(dim=0).values
        v = [float(x) for x in mem_t.cpu()]
        phase_mem = {p: {"after": round(v[2 * i], 4), "peak": round(v[2 * i + 1], 4)} for i, p in enumerate(PHASES)}
        peak_gib, reserved_gib, init_gib, host_rss_gib = (round(x, 4) for x in v[6:10])
        per_rank_peak = [round(x, 4) for x in per_rank_peak]
    else:
        phase_mem = {p: {"after": None, "peak": None} for p in PHASES}
        peak_gib = reserved_gib = per_rank_peak = None
        if distributed:
            t = torch.tensor([host_rss_gib], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            host_rss_gib = float(t[0])
        host_rss_gib = round(host_rss_gib, 4)

    tokens_per_s = args.micro_batch * seq * world / (ms_per_iter / 1e3)
    tflops_per_gpu = base["flops_per_token"] * tokens_per_s / world / 1e12
    rec = dict(base)
    rec.update({
        "status": "ok",
        "ms_per_iter": round(ms_per_iter, 3),
        "wall_ms_per_iter": round(wall_ms, 3),
        "iter_ms": [round(x, 3) for x in iter_ms],
        "phase_ms": {p: round(v, 3) for p, v in phase_ms.items()},
        "phase_mem_gib": phase_mem,
        "init_gib": init_gib if init_gib is None else round(init_gib, 4),
        "peak_gib": peak_gib,
        "peak_gib_per_rank": per_rank_peak,
        "peak_reserved_gib": reserved_gib,
        "host_peak_rss_gib": host_rss_gib,
        "tokens_per_s": round(tokens_per_s, 1),
        "tflops_per_gpu": round(tflops_per_gpu, 3),
        "mfu": round(tflops_per_gpu / args.peak_tflops, 5),
        "host_min_avail_gib": (None if hostmon is None or hostmon.min_avail_gib is None
                               else round(hostmon.min_avail_gib, 3)),
        "loss_first": loss_list[0],
        "loss_last": loss_list[-1],
        "losses": loss_list,
    })
    reporter.emit(rec)


if __name__ == "__main__":
    main()
