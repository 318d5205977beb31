// The tracker's exports read by Python, as the tools that consume them do: the pickle by a
// restricted unpickler (no globals), the JSON by json, the CSV by csv. python3 comes from
// scripts/setup; where it is missing this executable reports itself skipped (exit 77). The
// C++ side of the tracker is tested in tracker_adaptor.test.cpp.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>

#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "support/prerequisite.hpp"
#include "support/recording_resource.hpp"
#include "support/tracked_pool.hpp"

using upstream_t = vram::test::recording_resource<vram::host_source>;
using vram::test::tenants;

namespace {

const vram::test::prerequisite python_needed{"python3 with its pickle module (scripts/setup installs python3)", [] {
  return std::system("python3 -c 'import pickle' >/dev/null 2>&1") == 0;
}};

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("vram_tracker_python_" + std::to_string(::getpid()) + "_" + name);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("tracker_adaptor: exports load in Python (restricted unpickler, json, csv)", "[adaptor][tracker][export]") {
  tenants t;
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up, {.registry = t.reg});
  std::vector<std::pair<void*, std::size_t>> live;
  {
    vram::tenant_scope ts(t.model_a);
    vram::tag_scope tag("layer12.attn");
    for (std::size_t i = 1; i <= 5; ++i) live.emplace_back(tr.allocate_sync(i * 100000), i * 100000);
  }
  std::string long_tag(300, 'x');  // BINUNICODE path
  {
    vram::tag_scope tag(long_tag.c_str());
    live.emplace_back(tr.allocate(vram::stream_ref{}, 70000, 256, t.model_b), 70000);
  }
  tr.deallocate_sync(live[0].first, live[0].second);
  live.erase(live.begin());

  auto pickle = temp_path("snapshot.pickle");
  auto json = temp_path("snapshot.json");
  auto csv = temp_path("log.csv");
  REQUIRE(tr.dump(pickle.string()));
  REQUIRE(tr.dump(json.string()));
  REQUIRE(tr.dump(csv.string()));

  std::string bytes = slurp(pickle);
  REQUIRE(bytes.size() > 2);
  CHECK(static_cast<unsigned char>(bytes[0]) == 0x80);
  CHECK(bytes[1] == 2);
  CHECK(bytes.back() == '.');

  std::string text = slurp(csv);
  CHECK(text.rfind("Thread,Time,Action,Pointer,Size,Stream,Tenant\n", 0) == 0);
  CHECK(text.find(",allocate,0x") != std::string::npos);
  CHECK(text.find(",free,0x") != std::string::npos);
  CHECK(text.find("job/model_b") != std::string::npos);

  auto script = temp_path("check.py");
  {
    std::ofstream py(script);
    py << R"(import csv, io, json, pickle, sys
class Refuse(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused %s.%s" % (module, name))
snap = Refuse(open(sys.argv[1], "rb")).load()
segs = snap["segments"]
assert len(segs) == 5, len(segs)
addrs = [s["address"] for s in segs]
assert addrs == sorted(addrs)
for s in segs:
    assert s["device"] == 0 and s["segment_pool_id"] == (0, 0) and s["is_expandable"] is False
    total = 0
    for b in s["blocks"]:
        assert b["address"] == s["address"] + total
        total += b["size"]
        assert b["state"] == "active_allocated"
    assert total == s["total_size"]
frames = [s["blocks"][0]["frames"][0] for s in segs]
assert {f["filename"] for f in frames} == {"tenant:job/model_a", "tenant:job/model_b"}, frames
assert any(f["name"] == "layer12.attn" for f in frames)
assert any(f["name"] == "x" * 300 for f in frames)
trace = snap["device_traces"][0]
actions = [e["action"] for e in trace]
assert actions.count("alloc") == 6 and actions.count("free_requested") == 1, actions
assert actions.count("segment_alloc") == 6 and actions.count("free_completed") == 1
assert all(e["time_us"] > 1.6e15 for e in trace)
assert sum(s["total_size"] for s in segs) == 1470000
j = json.load(open(sys.argv[2]))
assert j["live_bytes"] == 1470000 and j["by_tenant"][0]["tenant"] == "job/model_a"
rows = list(csv.DictReader(open(sys.argv[3])))
assert [r["Action"] for r in rows].count("allocate") == 6
assert rows[0]["Tenant"] == "job/model_a" and int(rows[0]["Size"]) == 100000
print("python round trip ok")
)";
  }
  std::string cmd = "python3 " + script.string() + " " + pickle.string() + " " + json.string() + " " + csv.string();
  CHECK(std::system(cmd.c_str()) == 0);
  std::filesystem::remove(script);
  for (auto& p : {pickle, json, csv}) std::filesystem::remove(p);
  for (auto [p, n] : live) tr.deallocate_sync(p, n);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker_observer: a pool's segments and blocks load in Python", "[adaptor][tracker]") {
  vram::test::half_freed_pool p;
  auto pickle = temp_path("pool.pickle");
  auto script = temp_path("pool.py");
  REQUIRE(p.tracker.dump(pickle.string()));
  {
    std::ofstream py(script);
    py << R"(import pickle, sys
class Refuse(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused")
snap = Refuse(open(sys.argv[1], "rb")).load()
segs = snap["segments"]
assert len(segs) == int(sys.argv[2]), (len(segs), sys.argv[2])
active = 0
for s in segs:
    at = s["address"]
    for b in s["blocks"]:
        assert b["address"] == at
        at += b["size"]
        if b["state"] == "active_allocated":
            active += b["size"]
            assert b["frames"][0]["filename"] == "tenant:job/model_a" and b["frames"][0]["name"] == "weights"
    assert at == s["address"] + s["total_size"]
assert active == 6 << 20, active
assert any(b["state"] == "inactive" for s in segs for b in s["blocks"])
)";
  }
  std::string cmd = "python3 " + script.string() + " " + pickle.string() + " " +
                    std::to_string(p.up.counters().live_allocations());
  CHECK(std::system(cmd.c_str()) == 0);
  std::filesystem::remove(pickle);
  std::filesystem::remove(script);
  p.release();
  CHECK(p.up.counters().live_allocations() == 0);
}
