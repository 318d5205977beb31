// Who holds VRAM: statistics, a tracker with tenants and tags, the exports (PyTorch memory
// snapshot for pytorch.org/memory_viz, RMM CSV, JSON), and a retry adaptor that releases a
// pool's cache before giving up and dumps who holds what when it does.
//
//   observability [output-directory]     (default: the current directory)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/source/simulated_device_source.hpp>

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  constexpr std::size_t MiB = std::size_t{1} << 20;
  vram::tenant training = vram::make_tenant("training");
  vram::tenant eval = vram::make_tenant("eval");

  // source -> statistics (cheap, always on) -> tracker (who holds what) -> retry on OOM
  vram::simulated_device_source gpu(vram::simulated_device_options{.capacity = 256 * MiB, .granularity = 2 * MiB});
  using stats_t = vram::statistics_adaptor<vram::simulated_device_source>;
  using tracker_t = vram::tracker_adaptor<stats_t>;
  tracker_t tracker(stats_t(gpu), {.capture_stacks = false});
  vram::retry_adaptor<tracker_t> mr(tracker, {.max_retries = 1,
                                              .dump_path = dir + "/oom-report.txt",
                                              .dump_writer = [tracker](std::ostream& out) { tracker.write_report(out); }});

  // A "cache" the retry adaptor may drop to make room.
  std::vector<std::pair<void*, std::size_t>> cache;
  mr.add_reclaim([&](std::size_t, vram::stream_ref) -> std::size_t {
    // statistics_adaptor counts a free for the tenant in scope at the free: free the cache as
    // its owner. (The tracker records the owner per pointer and needs no scope.)
    vram::tenant_scope owner(training);
    std::size_t freed = 0;
    for (auto [p, n] : cache) mr.deallocate_sync(p, n), freed += n;
    cache.clear();
    return freed;
  });

  std::vector<std::pair<void*, std::size_t>> held;
  {
    vram::tenant_scope t(training);
    for (int layer = 0; layer < 4; ++layer) {
      char tag[32];
      std::snprintf(tag, sizeof tag, "layer%d.attn", layer);
      vram::tag_scope s(tag);
      held.emplace_back(mr.allocate_sync(24 * MiB), 24 * MiB);
    }
    vram::tag_scope s("dataloader.cache");
    for (int i = 0; i < 4; ++i) cache.emplace_back(mr.allocate_sync(16 * MiB), 16 * MiB);
  }
  {
    vram::tenant_scope t(eval);
    vram::tag_scope s("kv_cache");
    held.emplace_back(mr.allocate_sync(64 * MiB), 64 * MiB);  // needs the cache dropped first
    try {
      (void)mr.allocate_sync(200 * MiB);  // cannot fit: dumps oom-report.txt and throws
    } catch (const vram::out_of_memory& e) {
      std::printf("gave up: %s (retries %zu, reclaimed %zu MiB)\n", e.what(), mr.retries(), mr.reclaimed_bytes() / MiB);
    }
  }

  auto st = tracker.upstream().stats();
  std::printf("live %zu MiB, peak %zu MiB, %zu allocations, %zu OOMs; training %lld MiB, eval %lld MiB\n",
              st.live_bytes / MiB, st.peak_live_bytes / MiB, st.total_allocations, st.ooms,
              static_cast<long long>(tracker.upstream().stats(training).live_bytes) / static_cast<long long>(MiB),
              static_cast<long long>(tracker.upstream().stats(eval).live_bytes) / static_cast<long long>(MiB));
  tracker.write_report(std::cout);
  bool ok = tracker.dump(dir + "/snapshot.pickle") && tracker.dump(dir + "/snapshot.json") &&
            tracker.dump(dir + "/log.csv");
  std::printf("wrote %s/snapshot.pickle (open it in pytorch.org/memory_viz), snapshot.json, log.csv, oom-report.txt\n",
              dir.c_str());
  for (auto [p, n] : held) mr.deallocate_sync(p, n);
  return ok ? 0 : 1;
}
