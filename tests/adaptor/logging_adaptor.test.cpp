#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <vram/adaptor/logging_adaptor.hpp>
#include <vram/source/host_source.hpp>
#include <vram/trace/read_trace.hpp>

#include "support/recording_resource.hpp"

using recording_t = vram::test::recording_resource<vram::host_source>;

TEST_CASE("logging_adaptor: writes RMM's CSV with a Tenant column, read back by the trace reader",
          "[adaptor][logging]") {
  auto reg = std::make_shared<vram::tenant_registry>();
  auto job = reg->create("job");
  auto model = reg->create("model", job);
  recording_t up;
  std::ostringstream log;
  {
    vram::logging_adaptor<recording_t> r(up, log, reg);
    std::vector<std::pair<void*, std::size_t>> live;
    {
      vram::tenant_scope ts(model);
      for (std::size_t i = 1; i <= 10; ++i) live.emplace_back(r.allocate_sync(i * 1000), i * 1000);
    }
    for (std::size_t i = 0; i < live.size(); i += 2) r.deallocate_sync(live[i].first, live[i].second);
    CHECK_THROWS_AS(r.allocate_sync(std::size_t{1} << 52), vram::out_of_memory);
    for (std::size_t i = 1; i < live.size(); i += 2) r.deallocate_sync(live[i].first, live[i].second);
    r.flush();
  }
  CHECK(up.counters().live_allocations() == 0);

  std::string text = log.str();
  INFO(text);
  CHECK(text.rfind("Thread,Time,Action,Pointer,Size,Stream,Tenant\n", 0) == 0);
  CHECK(text.find(",allocate,0x") != std::string::npos);
  CHECK(text.find(",allocate failure,(nil),4503599627370496,0x0,default") != std::string::npos);
  CHECK(text.find(",job/model\n") != std::string::npos);
  std::size_t lines = 0;
  for (char c : text) lines += c == '\n';
  CHECK(lines == 1 + 10 + 10 + 1);

  auto t = vram::trace::read_rmm_csv(text, "logging_adaptor");
  CHECK(t.allocs() == 10);
  CHECK(t.frees() == 10);
  // The reader skips the "allocate failure" row; some versions count it as a warning (its
  // Pointer is "(nil)", as RMM writes it since 24.12). Nothing else may warn.
  CHECK(t.warnings <= 1);
  for (auto& w : t.warning_examples) CHECK(w.find("line 17") != std::string::npos);
  std::uint64_t bytes = 0;
  for (const auto& e : t.events)
    if (e.kind == vram::trace::event::op::alloc) bytes += e.bytes;
  CHECK(bytes == 55000);
}
