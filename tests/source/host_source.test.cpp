// host_source's own behaviour: stream-ordered frees run after the stream's pending work,
// and copies share one allocation table.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <vram/source/host_source.hpp>

#include "support/misuse_capture.hpp"

TEST_CASE("host source: a free on a host stream waits for the stream's pending work", "[source][host]") {
  vram::host_source source;
  vram::host_stream stream;
  auto* p = static_cast<unsigned char*>(source.allocate(stream, 4096));
  std::atomic<bool> go{false};
  std::atomic<int> seen{0};
  stream.enqueue([&] {
    while (!go) std::this_thread::yield();
    std::memset(p, 7, 4096);  // still ours: the free below is queued behind this task
    seen = p[4095];
  });
  source.deallocate(stream, p, 4096);
  CHECK_FALSE(source.owns(p));  // forgotten at once, so a second free is caught ...
  go = true;
  stream.synchronize();  // ... while the memory itself was freed after the task
  CHECK(seen == 7);
}

TEST_CASE("host source: copies share the table and compare equal", "[source][host]") {
  vram::test::misuse_capture capture;
  vram::host_source a;
  vram::host_source b = a;
  vram::host_source other;
  CHECK(a == b);
  CHECK_FALSE(a == other);
  void* p = a.allocate_sync(100, 4096);
  CHECK(vram::is_aligned(p, 4096));
  CHECK(b.owns(p));
  other.deallocate_sync(p, 100, 4096);  // not other's: reported, nothing freed
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  b.deallocate_sync(p, 100, 64);  // wrong alignment: reported
  CHECK(capture.count(vram::misuse::wrong_alignment) == 1);
  b.deallocate_sync(p, 100, 4096);
  CHECK(a.live_allocations() == 0);
}
