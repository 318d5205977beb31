// Fuzzes activation_arena<fault_injection_adaptor<host_source>>: allocate, free in any order, mark /
// rewind, reset, release, injected upstream failures and misuse (double free, wrong size,
// a stale pointer after reset, a stale mark), against the reference model.
//
// The model follows the arena's contract: rewind(m) frees exactly the blocks allocated after
// m, and is only issued when no block from before m was freed since m was taken (the
// documented pre-condition); a rewind to an earlier mark discards the marks taken after it.

#include <optional>

#include <vram/alloc/activation_arena.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "fuzz_common.hpp"

using namespace vram::fuzz;
using source = vram::fault_injection_adaptor<vram::host_source>;

namespace {
struct mark_entry {
  vram::arena_mark mark;
  std::size_t seq;    // blocks with seq >= this were allocated after the mark
  bool dirty = false; // a block from before the mark was freed since
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  misuse_counter misuse;
  source upstream{vram::host_source{}};
  std::size_t chunk = std::size_t{1} << in.ConsumeIntegralInRange<int>(12, 20);
  {
    vram::activation_arena<source> arena(upstream, vram::stream_ref{}, {.chunk_bytes = chunk});
    model m;
    std::vector<mark_entry> marks;
    std::vector<std::pair<void*, std::size_t>> stale;  // blocks live at the last reset
    std::optional<vram::arena_mark> stale_mark;
    std::size_t seq = 0, expected_reports = 0;
    std::map<void*, std::size_t> seq_of;
    while (in.remaining_bytes() > 0) {
      switch (in.ConsumeIntegralInRange<int>(0, 11)) {
        case 0: case 1: case 2: case 3: {  // allocate
          if (m.size() >= 96) break;
          std::size_t bytes = fuzz_size(in, 2 * chunk);
          std::size_t align = fuzz_alignment(in);
          try {
            void* p = arena.allocate(vram::stream_ref{}, bytes, align);
            if (bytes == 0) {
              VRAM_FUZZ_CHECK(p == nullptr);
            } else {
              m.add(p, bytes, std::max(align, vram::default_alignment), 0, true);
              seq_of[p] = seq++;
            }
          } catch (const vram::out_of_memory&) {
            VRAM_FUZZ_CHECK(bytes != 0);
          }
          break;
        }
        case 4: case 5: case 6: {  // free: the top (LIFO) or any block
          if (m.empty()) break;
          char* p;
          if (in.ConsumeBool()) {
            auto top = std::max_element(seq_of.begin(), seq_of.end(),
                                        [](auto& a, auto& b) { return a.second < b.second; });
            p = static_cast<char*>(top->first);
          } else {
            p = m.pick(in.ConsumeIntegral<std::size_t>()).first;
          }
          auto b = m.take(p, true);
          std::size_t s = seq_of[p];
          seq_of.erase(p);
          for (auto& mk : marks)
            if (s < mk.seq) mk.dirty = true;
          arena.deallocate(vram::stream_ref{}, p, b.bytes);
          break;
        }
        case 7:  // mark
          if (marks.size() < 8) marks.push_back({arena.mark(), seq});
          break;
        case 8: {  // rewind to a clean mark
          if (marks.empty()) break;
          std::size_t k = in.ConsumeIntegralInRange<std::size_t>(0, marks.size() - 1);
          if (marks[k].dirty) break;
          arena.rewind(marks[k].mark);
          for (auto it = seq_of.begin(); it != seq_of.end();) {
            if (it->second >= marks[k].seq) {
              m.take(it->first, true);
              it = seq_of.erase(it);
            } else {
              ++it;
            }
          }
          marks.resize(k + 1);
          break;
        }
        case 9: {  // reset (end of step), or release
          if (in.ConsumeBool()) {
            m.verify_all();
            stale.clear();
            for (const auto& [p, b] : m.blocks()) stale.emplace_back(p, b.bytes);
            if (!marks.empty()) stale_mark = marks.back().mark;
            arena.reset();
            m.clear();
            seq_of.clear();
            marks.clear();
          } else {
            arena.release();
          }
          break;
        }
        case 10:  // upstream faults
          upstream.set_plan({.fail_call = in.ConsumeIntegralInRange<std::size_t>(0, 3), .sticky = in.ConsumeBool()});
          break;
        case 11: {  // misuse: reported (or refused) and nothing changes
          auto before = arena.stats();
          int kind = in.ConsumeIntegralInRange<int>(0, 2);
          if (kind == 0 && !stale.empty()) {
            auto [p, bytes] = stale[in.ConsumeIntegralInRange<std::size_t>(0, stale.size() - 1)];
            if (m.inside_live(p)) break;  // its address is live again: indistinguishable
            arena.deallocate(vram::stream_ref{}, p, bytes);
            ++expected_reports;
          } else if (kind == 1 && !m.empty()) {
            auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
            arena.deallocate(vram::stream_ref{}, p, b.bytes + 1);
            ++expected_reports;
          } else if (kind == 2 && stale_mark) {
            bool threw = false;
            try {
              arena.rewind(*stale_mark);
            } catch (const vram::invalid_argument&) {
              threw = true;
            }
            VRAM_FUZZ_CHECK(threw);
          } else {
            break;
          }
          VRAM_FUZZ_CHECK(misuse_counter::reports == expected_reports);
          auto after = arena.stats();
          VRAM_FUZZ_CHECK(after.live_bytes == before.live_bytes);
          VRAM_FUZZ_CHECK(after.live_allocations == before.live_allocations);
          break;
        }
      }
      check(arena, m);
      VRAM_FUZZ_CHECK(arena.stats().reserved_bytes == upstream.live_bytes());
    }
    m.verify_all();
    for (const auto& [p, b] : m.blocks()) arena.deallocate(vram::stream_ref{}, p, b.bytes);
    m.clear();
    check(arena, m);
  }
  VRAM_FUZZ_CHECK(upstream.live_bytes() == 0);
  return 0;
}
