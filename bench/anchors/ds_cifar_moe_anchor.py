#!/usr/bin/env python3
"""DeepSpeed's CIFAR-10 MoE tutorial (DeepSpeedExamples training/cifar/cifar10_deepspeed.py --moe,
run_ds_moe.sh: 2 GPUs, ep 2, 2 experts, top-1, RSample, --moe-param-group) as an anchor for
`example_cifar10 --moe` (examples/cifar10.cpp; scripts/device/cifar_moe_2gpu.sh runs both on the
same files). Written from the tutorial's description, with the differences below named:

  net        conv1 3->6 k5, maxpool 2, conv2 6->16 k5, maxpool 2, fc1 400->120, fc2 120->84 (ReLU
             after each), then per --num-experts entry one deepspeed.moe.layer.MoE(hidden 84,
             expert Linear(84, 84), num_experts, ep_size, use_residual (--mlp-type residual), k,
             min_capacity, noisy_gate_policy) whose aux loss is dropped (as the tutorial's
             `x, _, _ = layer(x)`), then fc4 84->10; loss = cross entropy.
  config     the tutorial's get_ds_config: train_batch_size 16 (micro 16 / world), Adam lr 1e-3
             betas (0.8, 0.999) eps 1e-8 weight decay 3e-7 (DeepSpeed's Adam = AdamW), WarmupLR
             0 -> 1e-3 over 1000 steps, clipping 1.0, --dtype (the tutorial's default fp16:
             dynamic loss scale 2^15, window 500, hysteresis 2), ZeRO --stage (0), and the
             parameters split by split_params_into_different_moe_groups_for_optimizer
             (--moe-param-group, as run_ds_moe.sh passes). --torch-adam: the optimizer as
             torch.optim.AdamW (the same update; no FusedAdam JIT build, which takes minutes).
  data       the CIFAR-10 binary files in --data (data_batch_1..5.bin, test_batch.bin; no
             torchvision), normalised as the tutorial's ToTensor + Normalize(0.5, 0.5):
             (x / 255 - 0.5) / 0.5; the loader is deepspeed.initialize's (DistributedSampler,
             seed 0, micro-batch per rank).
  loop       the tutorial's: forward, cross entropy, engine.backward, engine.step, loss.item();
             rank 0 prints the mean loss of the last --log-interval steps (run_ds_moe.sh: 100).
  test       every rank runs the whole test set in one forward (as examples/cifar10.cpp; the
             tutorial uses batches of 4, where eval capacity C = ceil(4 / E) drops tokens);
             accuracy from rank 0.
Differences from the tutorial, each a flag (the defaults make both sides see the same numbers):
  --init zerotrain (default): the weights are those example_cifar10 starts from for --seed:
             torch.manual_seed(seed), then PyTorch's default init in zerotrain's order (conv1,
             conv2, fc1, fc2, per MoE layer the gate (no bias), each expert on its own, with
             residual the dense mlp and the coefficient, then fc4), each rank keeping its own
             experts by global index; with --mlp-type residual each layer its own dense mlp (the
             tutorial's layers share fc3 as their mlp). --init tutorial: the tutorial's (experts
             deep copies of one fc3; DeepSpeed's order).
  set_epoch  the sampler is reshuffled each epoch (sampler.set_epoch(epoch), as zerotrain's
             loader does; the tutorial's DeepSpeedDataLoader never calls it, so its every epoch
             repeats epoch 0's order); --no-set-epoch restores that.
Timing: ms_per_step = wall time of the steps after the first --timed-after (10), over their count,
each step ended by its loss.item() (and a cuda synchronize at the end); peak_mib =
torch.cuda.max_memory_allocated on rank 0. Rank 0 writes one JSON object to --out: the printed
losses (step, loss), test accuracy, ms_per_step, peak memory. `--device cpu` (gloo, fp32,
DS_ACCELERATOR=cpu, torch AdamW) is the smoke path on CPU ranks:
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 bench/anchors/ds_cifar_moe_anchor.py --data DIR \\
      --device cpu --dtype fp32 --ep-world-size 2 --num-experts 2 --top-k 1 --noisy-gate-policy RSample \\
      --moe-param-group --steps 100 --log-interval 10 --out r.json
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_env import torch_cuda_arch_for_deepspeed  # noqa: E402

RECORD = 1 + 3 * 32 * 32  # label byte, then the CHW pixels


class CifarBinary(torch.utils.data.Dataset):
    """The CIFAR-10 "binary version" files: (image (3, 32, 32) normalised to [-1, 1], label)."""

    def __init__(self, root, train):
        names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
        raw = []
        for n in names:
            path = os.path.join(root, n)
            b = np.fromfile(path, dtype=np.uint8)
            if b.size == 0 or b.size % RECORD:
                raise SystemExit(f"{path}: {b.size} bytes is not a whole number of {RECORD}-byte records")
            raw.append(b.reshape(-1, RECORD))
        raw = np.concatenate(raw)
        self.labels = torch.from_numpy(raw[:, 0].astype(np.int64))
        pixels = torch.from_numpy(raw[:, 1:].copy()).reshape(-1, 3, 32, 32)
        self.images = (pixels.float() / 255.0 - 0.5) / 0.5  # ToTensor, then Normalize(0.5, 0.5)

    def __len__(self):
        return self.labels.numel()

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class Net(nn.Module):
    """The tutorial's Net with --moe."""

    def __init__(self, a):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        fc3 = nn.Linear(84, 84)  # the expert every MoE layer deep-copies
        self.moe_layer_list = nn.ModuleList([
            MoE(hidden_size=84, expert=fc3, num_experts=e, ep_size=a.ep_world_size, use_residual=a.mlp_type == "residual",
                k=a.top_k, min_capacity=a.min_capacity, noisy_gate_policy=a.noisy_gate_policy)
            for e in a.num_experts])
        self.fc4 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        for layer in self.moe_layer_list:
            x, _, _ = layer(x)  # the tutorial drops the aux loss
        return self.fc4(x)


@torch.no_grad()
def init_like_zerotrain(net, a, ep_rank):
    """example_cifar10's initial weights for --seed: PyTorch's default init of fresh modules, drawn
    from the CPU generator in CifarMoENet's construction order (the ep-1 net), copied into the
    DeepSpeed net; this rank keeps experts ep_rank * E_l .. (ep_rank + 1) * E_l - 1."""
    torch.manual_seed(a.seed)
    src = {"conv1": nn.Conv2d(3, 6, 5), "conv2": nn.Conv2d(6, 16, 5), "fc1": nn.Linear(400, 120),
           "fc2": nn.Linear(120, 84)}
    layers = []
    for e in a.num_experts:
        gate = nn.Linear(84, e, bias=False)
        experts = [nn.Linear(84, 84) for _ in range(e)]
        extra = (nn.Linear(84, 84), nn.Linear(84, 2)) if a.mlp_type == "residual" else None
        layers.append((gate, experts, extra))
    src["fc4"] = nn.Linear(84, 10)
    for name, m in src.items():
        getattr(net, name).load_state_dict(m.state_dict())
    for layer, (gate, experts, extra) in zip(net.moe_layer_list, layers):
        ds = layer.deepspeed_moe
        ds.gate.wg.weight.copy_(gate.weight)
        local = ds.experts.deepspeed_experts
        for i, ex in enumerate(local):
            ex.load_state_dict(experts[ep_rank * len(local) + i].state_dict())
        if extra is not None:
            # The tutorial hands one fc3 to every MoE layer, so with residual its layers share
            # one dense mlp; zerotrain's have their own (as this copy makes them).
            layer.mlp = copy.deepcopy(layer.mlp)
            layer.mlp.load_state_dict(extra[0].state_dict())
            layer.coefficient.load_state_dict(extra[1].state_dict())


def ds_config(a, world):
    adam = {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}
    if a.torch_adam:
        adam["torch_adam"] = True
    return {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 16 // world,
        "steps_per_print": 1 << 30,  # the tutorial's 2000; the loop prints its own
        "optimizer": {"type": "Adam", "params": adam},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}},
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": a.dtype == "bf16"},
        "fp16": {"enabled": a.dtype == "fp16", "fp16_master_weights_and_grads": False, "loss_scale": 0,
                 "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": a.stage, "allgather_partitions": True, "reduce_scatter": True,
                              "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                              "overlap_comm": True, "contiguous_gradients": True},
    }


def run(a, out):
    import deepspeed
    import torch.distributed as dist
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    out["deepspeed"] = deepspeed.__version__
    world, rank = dist.get_world_size(), dist.get_rank()
    if 16 % world:
        raise SystemExit(f"train_batch_size 16 does not divide over {world} ranks")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.device == "cuda" else torch.device("cpu")
    trainset, testset = CifarBinary(a.data, True), CifarBinary(a.data, False)
    torch.manual_seed(a.seed)
    net = Net(a)
    if a.init == "zerotrain":
        init_like_zerotrain(net, a, ep_rank=rank % a.ep_world_size)  # E + D: ep groups of consecutive ranks
    params = [p for p in net.parameters() if p.requires_grad]
    if a.moe_param_group:
        params = split_params_into_different_moe_groups_for_optimizer({"params": params, "name": "parameters"})
    engine, _, trainloader, _ = deepspeed.initialize(model=net, model_parameters=params, training_data=trainset,
                                                     config=ds_config(a, world))
    out["optimizer"] = f"{type(engine.optimizer).__name__}({type(engine.basic_optimizer).__name__})"
    dtype = {"fp16": torch.half, "bf16": torch.bfloat16}.get(a.dtype)
    criterion = nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    steps = a.steps or a.epochs * len(trainloader)
    printed, running, s, epoch = [], 0.0, 0, 0
    t_timed = time.perf_counter()
    while s < steps:
        if a.set_epoch:
            trainloader.data_sampler.set_epoch(epoch)
        for x, y in trainloader:
            if s == a.timed_after:
                t_timed = time.perf_counter()
            x, y = x.to(device), y.to(device)
            if dtype is not None:
                x = x.to(dtype)
            loss = criterion(engine(x), y)
            engine.backward(loss)
            engine.step()
            running += loss.item()
            s += 1
            if s % a.log_interval == 0:
                printed.append([s, running / a.log_interval])
                if rank == 0:
                    print(f"[epoch {epoch + 1}, step {s}] loss: {running / a.log_interval:.3f}", flush=True)
                running = 0.0
            if s == steps:
                break
        epoch += 1
    sync()
    ms = (time.perf_counter() - t_timed) * 1e3 / max(1, steps - a.timed_after)

    engine.eval()
    with torch.no_grad():
        x = testset.images.to(device)
        if dtype is not None:
            x = x.to(dtype)
        pred = engine(x).argmax(1).cpu()
    acc = 100.0 * (pred == testset.labels).sum().item() / len(testset)
    if rank == 0:
        print(f"accuracy on {len(testset)} test images: {acc:.1f}%", flush=True)
        if steps > a.timed_after:
            print(f"timing: {ms:.3f} ms/step over steps {a.timed_after + 1}-{steps}", flush=True)
    out.update(steps=steps, epochs_run=epoch, train_images=len(trainset), test_images=len(testset),
               micro_batch=16 // world, losses=printed, loss_last=printed[-1][1] if printed else None,
               test_accuracy=acc, ms_per_step=ms if steps > a.timed_after else None,
               peak_mib=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
               device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", torch=torch.__version__)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="directory of data_batch_1..5.bin and test_batch.bin")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: --epochs)")
    p.add_argument("--log-interval", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="example_cifar10's --seed (its default 0)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16", help="the tutorial's default fp16")
    p.add_argument("--stage", type=int, default=0, choices=(0, 1, 2))
    p.add_argument("--ep-world-size", "--ep", dest="ep_world_size", type=int, default=1)
    p.add_argument("--num-experts", type=int, nargs="+", default=[1])
    p.add_argument("--mlp-type", choices=("standard", "residual"), default="standard")
    p.add_argument("--top-k", type=int, default=1, choices=(1, 2))
    p.add_argument("--min-capacity", type=int, default=0)
    p.add_argument("--noisy-gate-policy", default="None", choices=("None", "RSample", "Jitter"))
    p.add_argument("--moe-param-group", action="store_true")
    p.add_argument("--init", choices=("zerotrain", "tutorial"), default="zerotrain")
    p.add_argument("--no-set-epoch", dest="set_epoch", action="store_false")
    p.add_argument("--torch-adam", action="store_true", help="torch.optim.AdamW instead of FusedAdam")
    p.add_argument("--timed-after", type=int, default=10)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test (gloo)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.epochs < 1 or a.steps < 0 or a.log_interval < 1:
        p.error("--epochs and --log-interval must be >= 1, --steps >= 0")
    a.noisy_gate_policy = None if a.noisy_gate_policy == "None" else a.noisy_gate_policy
    if a.device == "cpu":
        a.torch_adam = True  # FusedAdam needs CUDA

    rank = int(os.environ.get("RANK", 0))
    out = {"anchor": "DeepSpeed CIFAR-10 MoE tutorial", "world": int(os.environ.get("WORLD_SIZE", 1)),
           "ep": a.ep_world_size, "num_experts": a.num_experts, "top_k": a.top_k, "min_capacity": a.min_capacity,
           "noisy_gate_policy": a.noisy_gate_policy, "mlp_type": a.mlp_type, "moe_param_group": a.moe_param_group,
           "dtype": a.dtype, "stage": a.stage, "seed": a.seed, "init": a.init, "set_epoch": a.set_epoch,
           "log_interval": a.log_interval}
    try:
        if a.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        else:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
            torch_cuda_arch_for_deepspeed(dev)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo" if a.device == "cpu" else "nccl")
        run(a, out)
        out["status"] = "ok"
    except BaseException as e:  # noqa: BLE001  (SystemExit included: one JSON line either way)
        traceback.print_exc()
        out.update(status="error", error=f"{type(e).__name__}: {e}")
    if rank == 0:
        line = json.dumps(out)
        if a.out:
            with open(a.out, "w") as f:
                f.write(line + "\n")
        print(line, flush=True)
    if out["status"] != "ok":
        sys.stdout.flush()
        os._exit(1)  # a peer may be stuck in a collective: do not wait for the process group
    import torch.distributed as dist
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
