"""What PyTorch's own caching allocator holds beside the tensors, measured on a GPU: cuBLAS's
workspaces per handle and stream (the forward's thread, autograd's thread), and a GPT-2 small
training loop (transformers, fp32, 2 x 16 tokens, AdamW foreach, gradient clipping, as HF
Trainer runs it) with its peak allocated and reserved. For vram-fit's model of a PyTorch run
(docs/fit.md). One JSON line; scripts/gpu-check runs it."""
import json, os, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
       "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
def blocks():
    snap = torch.cuda.memory._snapshot()
    return [(s["total_size"], [(b["size"], b["state"]) for b in s["blocks"]]) for s in snap["segments"]]
x = torch.randn(256, 256, device="cuda"); torch.cuda.synchronize()
a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
y = x @ x; torch.cuda.synchronize()
out["fwd_matmul_extra_allocated"] = torch.cuda.memory_allocated() - a0 - y.numel() * 4
out["fwd_matmul_extra_reserved"] = torch.cuda.memory_reserved() - r0
w = torch.randn(256, 256, device="cuda", requires_grad=True)
a1, r1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
(x @ w).sum().backward(); torch.cuda.synchronize()
out["bwd_extra_allocated"] = torch.cuda.memory_allocated() - a1 - w.grad.numel() * 4
out["bwd_extra_reserved"] = torch.cuda.memory_reserved() - r1
out["segments_after_probe"] = blocks()
del x, y, w
torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
try:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config()).cuda().train()
    opt = torch.optim.AdamW(m.parameters(), lr=5e-5)
    after_load = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    for step in range(5):
        ids = torch.randint(0, 50257, (2, 16), device="cuda")
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    out["gpt2"] = {"after_load": after_load, "peak_allocated": torch.cuda.max_memory_allocated(),
                   "peak_reserved": torch.cuda.max_memory_reserved(), "segments": len(torch.cuda.memory._snapshot()["segments"])}
except Exception as e:
    out["gpt2_error"] = repr(e)[:300]
print(json.dumps(out))
