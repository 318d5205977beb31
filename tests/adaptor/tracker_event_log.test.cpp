// tracker_options::event_log: every event appended to a file as it is recorded, whatever the
// ring keeps; the same lines write_csv() writes; read back by the trace readers (in memory and
// as a stream) with its tenants; four threads on four host streams at once; a file that cannot
// be created or written; and memory bounded by the ring, not the events (a child's peak
// resident set, 200 thousand events against 2 million).

#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/read_trace_stream.hpp>

#include "support/child_peak_memory.hpp"
#include "support/sanitizers.hpp"

namespace {

using tracker = vram::tracker_adaptor<vram::host_source>;

std::string scratch(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vram-event-log-" + std::to_string(::getpid()) + "-" + name)).string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `pairs` allocate/free pairs of 4 KiB .. 4 MiB, 16 blocks live at once, on `t`.
void churn(tracker& t, std::size_t pairs, vram::stream_ref s = {}) {
  std::vector<std::pair<void*, std::size_t>> live(16, {nullptr, 0});
  for (std::size_t i = 0; i < pairs; ++i) {
    auto& slot = live[i % live.size()];
    if (slot.first != nullptr) t.deallocate(s, slot.first, slot.second);
    slot.second = std::size_t{4096} << (i % 11);
    slot.first = t.allocate(s, slot.second);
  }
  for (auto [p, n] : live)
    if (p != nullptr) t.deallocate(s, p, n);
}

/// The peak resident set (KiB) of a child tracking `pairs` pairs with a log and a 1,024-event ring.
long peak_kib_of_logged_churn(std::size_t pairs, const std::string& log) {
  return vram::test::child_peak_kib([&] {
    tracker t(vram::host_source{}, vram::tracker_options{.event_capacity = 1024, .event_log = log});
    churn(t, pairs);
    return t.flush_event_log();
  });
}

}  // namespace

TEST_CASE("the event log holds every event the ring dropped, in write_csv's lines") {
  std::string path = scratch("small.csv");
  auto reg = std::make_shared<vram::tenant_registry>();
  {
    tracker t(vram::host_source{}, vram::tracker_options{.event_capacity = 4096, .registry = reg, .event_log = path});
    vram::tenant_scope scope(reg->create("serving, \"fast\""));
    churn(t, 300);
    REQUIRE(t.flush_event_log());
    CHECK(t.event_log_failures() == 0);
    CHECK(t.dropped_events() == 0);
    // The ring kept all of it: the log is what write_csv writes of it.
    std::ostringstream csv;
    t.write_csv(csv);
    CHECK(slurp(path) == csv.str());
    t.check_invariants();
  }
  vram::trace::trace read = vram::trace::read_trace(path);
  CHECK(read.allocs() == 300);
  CHECK(read.frees() == 300);
  CHECK(read.warnings == 0);
  REQUIRE(read.tenants.size() == 2);
  CHECK(read.tenants[1] == "serving, \"fast\"");
  std::filesystem::remove(path);
}

TEST_CASE("four threads on four streams: the log has each event once, the ring only the last") {
  std::string path = scratch("threads.csv");
  auto reg = std::make_shared<vram::tenant_registry>();
  {
    tracker t(vram::host_source{}, vram::tracker_options{.event_capacity = 256, .registry = reg, .event_log = path});
    std::vector<vram::host_stream> streams(4);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&, k] {
        vram::tenant_scope scope(reg->create("tenant" + std::to_string(k)));
        churn(t, 5000, streams[k]);
      });
    for (auto& th : threads) th.join();
    for (auto& s : streams) s.synchronize();
    CHECK(t.dropped_events() > 0);
    REQUIRE(t.flush_event_log());
    t.check_invariants();
  }
  for (const vram::trace::trace& read : {vram::trace::read_trace(path), vram::trace::read_trace_stream(path)}) {
    CHECK(read.allocs() == 4 * 5000);
    CHECK(read.frees() == 4 * 5000);
    CHECK(read.initial_live == 0);
    CHECK(read.warnings == 0);
    CHECK(read.tenants.size() == 5);  // the four, and index 0 (none)
    CHECK(read.streams == 4);
  }
  std::filesystem::remove(path);
}

TEST_CASE("an event log that cannot be created is a system_error naming it; one that cannot be written counts") {
  auto missing_dir = [] { tracker t(vram::host_source{}, vram::tracker_options{.event_log = "/nonexistent-dir/log.csv"}); };
  CHECK_THROWS_AS(missing_dir(), std::system_error);
  CHECK_THROWS_WITH(missing_dir(), Catch::Contains("/nonexistent-dir/log.csv") && Catch::Contains("No such file"));
  // /dev/full takes the open and refuses every write: even the header.
  CHECK_THROWS_AS([] { tracker t(vram::host_source{}, vram::tracker_options{.event_log = "/dev/full"}); }(),
                  std::system_error);
  // A log whose file cannot grow past 64 KiB (RLIMIT_FSIZE, as a full disk): in a child, the
  // allocator goes on, and the events that could not be written are counted.
  std::string path = scratch("filling.csv");
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 0;
    try {
      std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
      rlimit limit{64 << 10, 64 << 10};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
      tracker t(vram::host_source{}, vram::tracker_options{.event_log = path});
      churn(t, 20000);  // about 2 MB of lines
      if (t.flush_event_log()) rc |= 1;
      if (t.event_log_failures() < 20000) rc |= 2;  // most of the 40,000 events are lost
      if (t.stats().live_allocations != 0) rc |= 4;
      t.check_invariants();
    } catch (...) {
      rc |= 8;
    }
    ::_exit(rc);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::filesystem::file_size(path) <= std::uintmax_t{64} << 10);
  std::filesystem::remove(path);
}

TEST_CASE("a logged history's memory is bounded by the ring, not the events") {
  std::string small = scratch("bounded-small.csv"), large = scratch("bounded-large.csv");
  // Under a sanitizer the bound is not checked (support/sanitizers.hpp): the work runs smaller.
  const std::size_t small_pairs = vram::test::sanitized_build ? 5000 : 100000, large_pairs = 10 * small_pairs;
  long small_kib = peak_kib_of_logged_churn(small_pairs, small), large_kib = peak_kib_of_logged_churn(large_pairs, large);
  INFO("peak KiB: " << small_kib << " for " << 2 * small_pairs << " events, " << large_kib << " for " << 2 * large_pairs);
  CHECK(vram::trace::read_trace_stream(large).allocs() == large_pairs);
  // 1.8 million more events, 100 bytes each in a ring that kept them, would be 180 MB.
  if constexpr (vram::test::sanitized_build)
    WARN("a sanitizer's quarantine and shadow hold memory: the bound is checked in the unsanitized build");
  else
    CHECK(large_kib - small_kib < 4 * 1024);
  std::filesystem::remove(small);
  std::filesystem::remove(large);
}
