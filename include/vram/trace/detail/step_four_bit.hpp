#pragma once
// What a bitsandbytes 4-bit product (nf4, fp4) allocates beyond its packed weight, for the
// step generator (vram/trace/step.hpp). Each rule and its source is in docs/fit.md, "4-bit
// products".
//
// Reproduces: the dequantized copy of the whole weight that MatMul4Bit makes before each
// product, forward and backward (`F.dequantize_4bit(B, state).to(A.dtype)`, in the dtype the
// weight was quantized from, then cast to the compute dtype); the input A that MatMul4Bit
// keeps as `ctx.tensors` when any input needs a gradient (bitsandbytes before 0.43.2).
// Leaves out: the fp32 absmax that double quantization dequantizes first (4 bytes per 64
// weights), and the single-token inference path, which multiplies the packed weight directly
// (`gemv_4bit`: no copy).

#include <cstdint>
#include <vector>

#include <vram/trace/model.hpp>

namespace vram::detail::trace::four_bit {

/// Bytes live while a weight of `elements` is dequantized: its bf16 copy; quantized from fp16,
/// the fp16 copy that dequantize_4bit returns and its bf16 cast, both live at the cast.
[[nodiscard]] constexpr std::uint64_t dequantized_bytes(std::uint64_t elements, bool from_fp16) noexcept {
  return (from_fp16 ? 4 : 2) * elements;
}

/// The inputs of one layer's products, by width per token, that MatMul4Bit keeps: q, k and
/// v's (one tensor: litgpt fuses them, Hugging Face's three projections share it), the output
/// projection's, the MLP's first products' (gate and up share one) and its last product's. A
/// mixture of experts: the router's, then the experts' first and last products' over the
/// experts_per_token copies of each token that the experts see between them.
[[nodiscard]] inline std::vector<std::uint64_t> kept_input_widths(const vram::trace::transformer_model& m) {
  if (!m.mixture()) return {m.hidden, m.hidden, m.hidden, m.ffn};
  const std::uint64_t k = m.experts_per_token;
  return {m.hidden, m.hidden, m.hidden, k * m.hidden, k * m.ffn};
}

}  // namespace vram::detail::trace::four_bit
