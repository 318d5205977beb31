#pragma once
// Built-in workloads, generated from model shapes, so vram-replay shows a real comparison on
// a fresh machine with no trace at hand:
//   transformer_training: weights, gradients, Adam state and per-layer activations freed in
//     reverse by the backward pass, with optional activation recompute (checkpointing);
//   kv_cache_inference: several streams decoding requests of different lengths, each layer's
//     KV cache growing by reallocation (torch.cat style), plus per-step temporaries.

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <vram/trace/detail/emitter.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {


struct transformer_shape {
  std::uint64_t layers = 24, hidden = 2048, heads = 16, vocab = 50257;
  std::uint64_t batch = 4, sequence = 1024;
  std::uint64_t dtype_bytes = 2;  ///< activations and weights (bf16); Adam state in fp32
  bool recompute = false;          ///< activation checkpointing: keep layer inputs only
  int steps = 2;
};

/// A training loop: Adam state appears at the first optimizer step (as in PyTorch); grads are
/// allocated by backward and freed by zero_grad(set_to_none=True).
inline trace transformer_training(const transformer_shape& m = {}) {
  detail::trace::emitter g(std::string("transformer-training") + (m.recompute ? "-recompute" : "") + " (L=" +
                              std::to_string(m.layers) + ", h=" + std::to_string(m.hidden) + ", b=" +
                              std::to_string(m.batch) + ", s=" + std::to_string(m.sequence) + ")");
  const std::uint64_t h = m.hidden, d = m.dtype_bytes, tokens = m.batch * m.sequence;
  // Parameter shapes of one layer: qkv, out proj, fc1, fc2, two norms (weight + bias each).
  const std::vector<std::uint64_t> layer_params = {3 * h * h, h * h, 4 * h * h, 4 * h * h, h, h, h, h, 3 * h, h, 4 * h, h};
  std::vector<std::uint64_t> params;  // sizes in elements
  params.push_back(m.vocab * h);      // embedding (tied with the output head)
  for (std::uint64_t l = 0; l < m.layers; ++l) params.insert(params.end(), layer_params.begin(), layer_params.end());
  params.push_back(h);
  params.push_back(h);
  std::vector<std::uint64_t> weights, grads, adam;
  for (auto n : params) weights.push_back(g.alloc(n * d));

  const std::uint64_t act = tokens * h * d;  // one [b, s, h] activation
  const std::uint64_t scores = m.batch * m.heads * m.sequence * m.sequence * d;
  for (int step = 0; step < m.steps; ++step) {
    std::uint64_t input = g.alloc(tokens * 8);  // token ids (int64)
    std::uint64_t x = g.alloc(act);              // embedding output
    // Forward: per layer, the tensors autograd saves for backward.
    auto layer_forward = [&](std::vector<std::uint64_t>& saved) {
      saved.push_back(g.alloc(act));                    // ln1 out
      saved.push_back(g.alloc(3 * act));                // qkv
      saved.push_back(g.alloc(scores));                 // attention probabilities
      std::uint64_t raw = g.alloc(scores);              // scores before softmax: temporary
      g.free(raw);
      saved.push_back(g.alloc(act));                    // attention output
      saved.push_back(g.alloc(act));                    // residual 1
      saved.push_back(g.alloc(act));                    // ln2 out
      saved.push_back(g.alloc(4 * act));                // fc1 out
      saved.push_back(g.alloc(4 * act));                // gelu out
      saved.push_back(g.alloc(act));                    // residual 2 (the next layer's input)
    };
    std::vector<std::vector<std::uint64_t>> saved(m.layers);
    std::vector<std::uint64_t> checkpoints;
    for (std::uint64_t l = 0; l < m.layers; ++l) {
      layer_forward(saved[l]);
      if (m.recompute) {  // keep only the layer output (the next layer's input)
        checkpoints.push_back(saved[l].back());
        saved[l].pop_back();
        for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) g.free(*it);
        saved[l].clear();
      }
    }
    std::uint64_t logits = g.alloc(tokens * m.vocab * 4);  // fp32 logits
    std::uint64_t loss = g.alloc(4);
    // Backward.
    std::uint64_t grad_logits = g.alloc(tokens * m.vocab * 4);
    g.free(logits);
    std::uint64_t grad_x = g.alloc(act);
    g.free(grad_logits);
    grads.assign(params.size(), 0);
    std::size_t p = params.size();
    auto next_grad = [&] {  // gradients appear in reverse parameter order
      --p;
      grads[p] = g.alloc(params[p] * d);
    };
    next_grad();  // final norm
    next_grad();
    for (std::uint64_t l = m.layers; l-- > 0;) {
      if (m.recompute) {
        layer_forward(saved[l]);
        g.free(saved[l].back());  // the recomputed output is the checkpoint again
        saved[l].pop_back();
      }
      for (std::size_t k = 0; k < layer_params.size(); ++k) next_grad();
      // Gradient temporaries for the MLP and attention, then the saved tensors die in reverse.
      std::uint64_t g_fc = g.alloc(4 * act);
      std::uint64_t g_scores = g.alloc(scores);
      g.free(g_fc);
      g.free(g_scores);
      for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) g.free(*it);
      saved[l].clear();
      if (m.recompute && l > 0) g.free(checkpoints[l - 1]);
      std::uint64_t next = g.alloc(act);
      g.free(grad_x);
      grad_x = next;
    }
    if (m.recompute && !checkpoints.empty()) g.free(checkpoints.back());
    next_grad();  // embedding
    g.free(grad_x);
    g.free(x);
    g.free(input);
    g.free(loss);
    // Optimizer step: Adam moments appear at the first step (fp32), one temporary per param.
    if (adam.empty())
      for (auto n : params) {
        adam.push_back(g.alloc(n * 4));
        adam.push_back(g.alloc(n * 4));
      }
    for (auto n : params) g.free(g.alloc(n * 4));
    for (auto id : grads) g.free(id);  // zero_grad(set_to_none=True)
  }
  for (auto id : adam) g.free(id);
  for (auto id : weights) g.free(id);
  return std::move(g).finish();
}

struct kv_cache_shape {
  std::uint64_t layers = 32, kv_heads = 8, head_dim = 128, dtype_bytes = 2;
  std::uint64_t hidden = 4096, vocab = 32000;
  std::uint32_t streams = 4;           ///< concurrent decode streams (one batch of requests each)
  std::uint64_t batch = 8;             ///< requests per stream batch
  std::uint64_t max_prompt = 1024, max_new_tokens = 512;
  std::uint64_t grow_tokens = 64;      ///< the cache is reallocated every this many tokens
  int requests_per_stream = 3;
  std::uint32_t seed = 42;
};

/// Multi-stream inference: each stream serves batches one after another; the per-layer K and
/// V caches grow by reallocation (allocate larger, free the old), temporaries per step.
inline trace kv_cache_inference(const kv_cache_shape& m = {}) {
  detail::trace::emitter g("kv-cache-inference (" + std::to_string(m.streams) + " streams, " +
                              std::to_string(m.layers) + " layers)");
  std::mt19937 rng(m.seed);
  const std::uint64_t per_token = m.batch * m.kv_heads * m.head_dim * m.dtype_bytes;  // one of K or V, one layer
  const std::uint64_t weights_bytes = 12 * m.hidden * m.hidden * m.dtype_bytes;
  std::vector<std::uint64_t> weights;
  for (std::uint64_t l = 0; l < m.layers; ++l) weights.push_back(g.alloc(weights_bytes));
  weights.push_back(g.alloc(m.vocab * m.hidden * m.dtype_bytes));

  struct request_batch {
    std::uint64_t tokens = 0, capacity = 0, end = 0;
    std::vector<std::uint64_t> cache;  // 2 per layer
    int served = 0;
  };
  std::vector<request_batch> batches(m.streams);
  auto start = [&](request_batch& b, std::uint32_t s) {
    b.tokens = 16 + rng() % m.max_prompt;
    b.end = b.tokens + 16 + rng() % m.max_new_tokens;
    b.capacity = (b.tokens + m.grow_tokens - 1) / m.grow_tokens * m.grow_tokens;
    b.cache.clear();
    for (std::uint64_t l = 0; l < 2 * m.layers; ++l) b.cache.push_back(g.alloc(b.capacity * per_token, s));
    std::uint64_t prefill = g.alloc(b.tokens * m.batch * m.hidden * m.dtype_bytes * 4, s);
    g.free(prefill, s);
  };
  for (std::uint32_t s = 0; s < m.streams; ++s) start(batches[s], s);
  for (bool any = true; any;) {
    any = false;
    for (std::uint32_t s = 0; s < m.streams; ++s) {
      auto& b = batches[s];
      if (b.served >= m.requests_per_stream) continue;
      any = true;
      // One decode step: hidden state and logits temporaries.
      std::uint64_t hs = g.alloc(m.batch * m.hidden * m.dtype_bytes, s);
      std::uint64_t logits = g.alloc(m.batch * m.vocab * 4, s);
      g.free(logits, s);
      g.free(hs, s);
      if (++b.tokens > b.capacity) {  // grow every layer's K and V
        b.capacity += m.grow_tokens;
        for (auto& id : b.cache) {
          std::uint64_t bigger = g.alloc(b.capacity * per_token, s);
          g.free(id, s);
          id = bigger;
        }
      }
      if (b.tokens >= b.end) {
        for (auto id : b.cache) g.free(id, s);
        b.cache.clear();
        if (++b.served < m.requests_per_stream) start(b, s);
      }
    }
  }
  for (auto id : weights) g.free(id);
  return std::move(g).finish();
}

/// The workloads `vram-replay` runs without a trace.
inline std::vector<trace> builtin_workloads() {
  transformer_shape recompute;
  recompute.recompute = true;
  return {transformer_training(), transformer_training(recompute), kv_cache_inference()};
}

}  // namespace vram::trace
