// detail::tracker::tracker_clock against the system clock it maps the time-stamp counter onto:
// its times never decrease, and they stay within a few microseconds of the system clock read
// beside them, in bursts of calls (between anchors) and across sleeps (at anchors), for long
// enough that the rate is measured from the counter and used; and a reading taken before
// another one anchored (the tracker reads the counter before its lock) neither goes back in
// time nor moves the anchor.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>

#include <vram/adaptor/detail/tracker/clock.hpp>

using vram::detail::tracker::tracker_clock;
using vram::detail::tracker::tracker_now_us;

TEST_CASE("tracker_clock: monotonic, and within microseconds of the system clock", "[adaptor][tracker]") {
  tracker_clock clock;
  INFO("time-stamp counter: " << clock.counter());
  std::int64_t last = 0, worst = 0;
  for (int round = 0; round < 60; ++round) {
    for (int i = 0; i < 2000; ++i) {
      const std::int64_t before = tracker_now_us();
      const std::int64_t t = clock.now_us();
      const std::int64_t after = tracker_now_us();
      REQUIRE(t >= last);
      last = t;
      // A preempted reading widens [before, after]; the bound is what the mapping adds to it.
      const std::int64_t off = t < before ? before - t : (t > after ? t - after : 0);
      worst = off > worst ? off : worst;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(round % 2 == 0 ? 300 : 1700));
  }
  INFO("the furthest reading from the system clock: " << worst << " us");
  CHECK(worst <= 50);
}

TEST_CASE("tracker_clock: a reading taken before another anchored keeps times from decreasing", "[adaptor][tracker]") {
  // The tracker reads the counter before its lock; a thread that waited for the lock brings
  // a reading older than the anchor the holder took. Its time is the last one returned.
  tracker_clock clock;
  std::int64_t last = clock.now_us();
  for (int round = 0; round < 8; ++round) {
    const std::uint64_t early = clock.ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the next reading anchors
    const std::int64_t anchored = clock.now_us();
    REQUIRE(anchored >= last);
    const std::int64_t late = clock.at(early);
    CHECK(late >= anchored);
    if (clock.counter()) CHECK(late == anchored);  // else at() reads the system clock again
    // Nor does the old reading move the anchor: the next time is still the system clock's.
    const std::int64_t next = clock.now_us();
    CHECK(next - tracker_now_us() <= 50);
    last = next;
  }
}
