// One side of scripts/replay-ab: a trace replayed through stream_pool on a contiguous simulated
// device (vram-replay's pool-contiguous), every operation timed alone with the time-stamp
// counter. Compiled twice: once against the baseline's include folder with the library's
// namespace renamed (-Dvram=vram_base -DVRAM_AB_SIDE=replay_base), once against this checkout's
// (-DVRAM_AB_SIDE=replay_head), so both run in one process, alternately, on the same machine
// state (docs/PERFORMANCE.md: this VM's speed changes between and within processes).
#include <cstdint>
#include <vector>

#include <x86intrin.h>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "replay_op.hpp"

/// Replays `ops` on a fresh pool; ticks[i] = time-stamp counter ticks around operation i;
/// `placement` = a hash of every returned address, as an offset from the first one (so two
/// builds that place every block alike agree, whatever the device's base address).
void VRAM_AB_SIDE(const std::vector<ab::op>& ops, const ab::shape& shape, std::vector<std::uint32_t>& ticks,
                  std::uint64_t& placement) {
  std::vector<vram::host_stream> host(shape.streams);
  std::vector<vram::stream_ref> streams(host.begin(), host.end());
  std::vector<void*> ptr(shape.slots, nullptr);
  std::vector<std::uint64_t> bytes(shape.slots);
  std::vector<std::uint32_t> on(shape.slots);
  vram::stream_pool<vram::simulated_device_source> pool(vram::simulated_device_source(std::size_t{80} << 30, true));
  ticks.resize(ops.size());
  placement = 0xcbf29ce484222325ull;
  std::uintptr_t origin = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const ab::op& o = ops[i];
    std::uint64_t start = ab::ticks_now();
    if (o.alloc)
      ptr[o.slot] = pool.allocate(streams[o.stream], o.bytes);
    else
      pool.deallocate(streams[o.stream], ptr[o.slot], o.bytes);
    ticks[i] = static_cast<std::uint32_t>(ab::ticks_now() - start);
    if (o.alloc) {
      auto at = reinterpret_cast<std::uintptr_t>(ptr[o.slot]);
      if (origin == 0) origin = at;
      placement = (placement ^ (at - origin)) * 0x100000001b3ull;  // FNV-1a over the offsets
      bytes[o.slot] = o.bytes;
      on[o.slot] = o.stream;
    } else {
      ptr[o.slot] = nullptr;
    }
  }
  for (std::uint32_t k = 0; k < shape.slots; ++k)
    if (ptr[k] != nullptr) pool.deallocate(streams[on[k]], ptr[k], bytes[k]);
}
