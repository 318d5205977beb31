"""A training loop on a GPU with vram as PyTorch's CUDA allocator, against PyTorch's own.

    python3 scripts/gpu/torch_training.py none|pool|plan      (one mode per process: PyTorch
                                                               swaps allocators only before its first allocation)

Prints one JSON line: the losses of 12 steps (the memory vram serves is not corrupted when
they equal PyTorch's own run's), the median step time, and with vram its statistics and, for
`plan`, the planned pool's (docs/planned_pool.md). The loop has what real ones have:
gradients that cross the step boundary (zero_grad(set_to_none=True)), AdamW (foreach),
autocast, gradient accumulation, a side stream that reads the gradients, an eval step every 5
and a smaller last batch. scripts/gpu-check runs the three modes and compares them.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
mode = sys.argv[1] if len(sys.argv) > 1 else "none"
if mode not in ("none", "pool", "plan"):
    sys.exit("usage: torch_training.py none|pool|plan")
if mode != "none":
    import vram
    import vram.torch

    vram.torch.use(plan=(mode == "plan"))
import torch  # noqa: E402 (after the allocator is chosen)

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
vocab, width = 8192, 512
layer = torch.nn.TransformerEncoderLayer(d_model=width, nhead=8, dim_feedforward=4 * width, batch_first=True, dropout=0.0)
model = torch.nn.Sequential(torch.nn.Embedding(vocab, width), torch.nn.TransformerEncoder(layer, num_layers=6),
                            torch.nn.Linear(width, vocab)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
side = torch.cuda.Stream()
losses, times = [], []
for step in range(12):
    batch = 16 if step != 11 else 9
    x = torch.randint(0, vocab, (batch, 256), generator=data).cuda()
    y = torch.randint(0, vocab, (batch, 256), generator=data).cuda()
    start = time.perf_counter()
    for micro in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[micro::2])
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y[micro::2].reshape(-1))
        loss.backward()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        norm = torch.stack([p.grad.norm() for p in model.parameters()]).sum()
    torch.cuda.current_stream().wait_stream(side)
    norm.record_stream(torch.cuda.current_stream())
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 5 == 4:
        with torch.no_grad():
            model.eval()
            _ = model(x[:4]).sum().item()
            model.train()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
    losses.append(loss.item())
    if mode != "none":
        vram.mark_step()
result = {"mode": mode, "torch": torch.__version__, "losses": losses, "norm": norm.item(),
          "step_ms_median": sorted(times[2:])[len(times[2:]) // 2] * 1e3}
if mode == "none":
    result["peak_allocated"] = torch.cuda.max_memory_allocated()
    result["peak_reserved"] = torch.cuda.max_memory_reserved()
else:
    s = vram.stats()
    result["peak_allocated"] = s["peak_live_bytes"]
    result["peak_reserved"] = s["peak_reserved_bytes"]
    result["plan"] = vram.plan_stats()
print(json.dumps(result))
