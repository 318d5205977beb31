// stream_pool on the shared real traces (VRAM_SHARED_TRACES), on a contiguous simulated
// device growing on demand: no leaks, invariants hold, no OOM at 1.25x the trace's peak live
// bytes, and reserved/live at the peak within 0.02 of an ideal online best fit (below).
// With VRAM_SANITIZED set in the environment only a prefix of each trace is replayed.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>
#include <vram/trace/read_trace.hpp>

using vram::trace::event;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t granule = 2 * MiB;  // the page of cudaMalloc / cuMemCreate

/// The reference: an online best fit over one contiguous range, 256-byte rounding, immediate
/// coalescing, and growth at the top (the free block at the top is extended, never left
/// behind). Its peak top is the least an online best-fit allocator holds. With `granule` > 1
/// the top grows in whole granules and the leftover is an ordinary free block (what a
/// VMM-backed allocator that best-fits into it does).
class ideal_best_fit {
 public:
  explicit ideal_best_fit(std::size_t granule) : granule_(granule) {}

  std::size_t allocate(std::size_t bytes) {
    std::size_t need = round(bytes);
    if (auto it = by_size_.lower_bound({need, 0}); it != by_size_.end()) {
      auto [size, addr] = *it;
      erase(addr, size);
      if (size > need) insert(addr + need, size - need);
      return addr;
    }
    std::size_t addr = top_;
    if (!by_addr_.empty()) {  // a free block ending at the top is extended
      auto last = std::prev(by_addr_.end());
      if (last->first + last->second == top_) {
        addr = last->first;
        erase(last->first, last->second);
      }
    }
    std::size_t end = addr + need, new_top = (end + granule_ - 1) / granule_ * granule_;
    if (new_top > end) insert(end, new_top - end);
    top_ = new_top;
    peak_top_ = std::max(peak_top_, top_);
    return addr;
  }

  void deallocate(std::size_t addr, std::size_t bytes) {
    std::size_t size = round(bytes);
    if (auto next = by_addr_.find(addr + size); next != by_addr_.end()) {
      size += next->second;
      erase(next->first, next->second);
    }
    if (auto after = by_addr_.lower_bound(addr); after != by_addr_.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == addr) {
        addr = prev->first;
        size += prev->second;
        erase(prev->first, prev->second);
      }
    }
    insert(addr, size);
  }

  [[nodiscard]] std::size_t peak_top() const noexcept { return peak_top_; }

 private:
  static std::size_t round(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  void insert(std::size_t addr, std::size_t size) {
    by_addr_.emplace(addr, size);
    by_size_.emplace(size, addr);
  }
  void erase(std::size_t addr, std::size_t size) {
    by_addr_.erase(addr);
    by_size_.erase({size, addr});
  }

  std::size_t granule_;
  std::size_t top_ = 0, peak_top_ = 0;
  std::map<std::size_t, std::size_t> by_addr_;            // free blocks: address -> size
  std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (size, address), smallest first
};

bool sanitized() { return std::getenv("VRAM_SANITIZED") != nullptr; }

vram::trace::trace load(const std::string& file) {
  std::string path = std::string(VRAM_SHARED_TRACES) + "/" + file;
  if (!std::ifstream(path)) FAIL("the shared trace " << path << " is missing: every machine of this project has it");
  vram::trace::trace t = vram::trace::read_trace(path);
  if (sanitized() && t.events.size() > 3000) t.events.resize(3000);  // frees of the cut part are skipped below
  return t;
}

/// Peak of live requested bytes and the ideal's peak top (in bytes) for `t`.
std::pair<std::size_t, std::size_t> ideal_peak(const vram::trace::trace& t, std::size_t g) {
  ideal_best_fit ideal(g);
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::size_t>> live;  // id -> (addr, bytes)
  std::size_t now = 0, peak = 0;
  for (const event& e : t.events) {
    if (e.kind == event::op::alloc) {
      if (e.bytes != 0) live[e.id] = {ideal.allocate(e.bytes), e.bytes};
      now += e.bytes;
      peak = std::max(peak, now);
    } else if (auto it = live.find(e.id); it != live.end()) {
      ideal.deallocate(it->second.first, it->second.second);
      now -= it->second.second;
      live.erase(it);
    }
  }
  return {peak, ideal.peak_top()};
}

struct pool_run {
  std::size_t peak_live = 0, peak_reserved = 0;
};

/// Replays `t` through a stream_pool on a contiguous device of 1.25x the peak live bytes, one
/// host stream per trace stream; checks invariants every `every` events and leaks at the end.
pool_run replay_pool(const vram::trace::trace& t, std::size_t peak_live) {
  std::size_t capacity = (peak_live + peak_live / 4 + granule - 1) / granule * granule;
  auto device = vram::simulated_device_source(
      vram::simulated_device_options{.capacity = capacity, .granularity = granule, .contiguous = true});
  std::vector<vram::host_stream> streams(t.streams);
  pool_run run;
  {
    vram::stream_pool<vram::simulated_device_source> pool(device, {});  // copies share the device state
    std::unordered_map<std::uint64_t, std::pair<void*, std::size_t>> live;
    std::size_t now = 0, every = sanitized() ? 500 : 2500;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      const event& e = t.events[i];
      vram::stream_ref s{streams[e.stream]};
      if (e.kind == event::op::alloc) {
        void* p = nullptr;
        REQUIRE_NOTHROW(p = pool.allocate(s, e.bytes));  // no OOM at 1.25x the peak live bytes
        live[e.id] = {p, e.bytes};
        now += e.bytes;
        if (now > run.peak_live) run.peak_live = now;
        run.peak_reserved = std::max(run.peak_reserved, pool.stats().reserved_bytes);
      } else if (auto it = live.find(e.id); it != live.end()) {
        pool.deallocate(s, it->second.first, it->second.second);
        now -= it->second.second;
        live.erase(it);
      }
      if (i % every == 0) pool.check_invariants();
    }
    for (auto& [id, pb] : live) pool.deallocate_sync(pb.first, pb.second);
    pool.check_invariants();
    auto st = pool.stats();
    CHECK(st.live_bytes == 0);
    CHECK(st.live_allocations == 0);
    run.peak_reserved = std::max(run.peak_reserved, st.peak_reserved_bytes);
    for (auto& st_ : streams) st_.synchronize();
  }
  CHECK(device.stats().live_bytes == 0);  // everything went back to the device
  return run;
}

}  // namespace

TEST_CASE("stream_pool: the shared traces, within 0.02 of an ideal online best fit", "[stream_pool][traces]") {
  // Two reference figures per trace: an ideal online best fit on one contiguous range,
  // computed independently of this test (the ideal above must reproduce it), and what this
  // pool's default configuration reserves on a 2 MiB-granule contiguous device.
  struct expected {
    const char* file;
    double ideal_target;  // reserved/live of the independent ideal best fit
    double achieved;      // the pool's reserved/live (docs/PERFORMANCE.md), not to regress
  };
  for (expected x : {expected{"memory.pickle", 1.005, 1.0053}, expected{"medium_1024_training_memory_snapshot.pickle", 1.012, 1.0103},
                     expected{"df_index_resolver.json.gz", 1.005, 1.0104}, expected{"pangu_2.6B.csv", 1.119, 1.1203}}) {
    SECTION(x.file) {
      vram::trace::trace t = load(x.file);
      auto [peak_live, ideal_top] = ideal_peak(t, 256);
      auto [peak_live_g, ideal_top_g] = ideal_peak(t, granule);
      REQUIRE(peak_live == peak_live_g);
      pool_run run = replay_pool(t, peak_live);
      CHECK(run.peak_live == peak_live);
      double ideal = double(ideal_top) / double(peak_live);
      double ideal_g = double(ideal_top_g) / double(peak_live);
      double pool = double(run.peak_reserved) / double(peak_live);
      WARN(x.file << ": pool " << pool << ", ideal best fit " << ideal << " (2 MiB growth: " << ideal_g << ")");
      CHECK(ideal >= 1.0);
      CHECK(pool >= 1.0);
      if (!sanitized()) {
        CHECK(ideal == Approx(x.ideal_target).margin(0.005));  // the ideal above reproduces the reference
        CHECK(pool <= x.ideal_target + 0.02);
        CHECK(pool <= ideal + 0.02);
        CHECK(pool <= x.achieved + 0.001);  // no regression past the recorded figure
      }
    }
  }
}
