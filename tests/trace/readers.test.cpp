// Trace readers: small hand-written files, hostile inputs, and the real traces in
// VRAM_SHARED_TRACES (counts from SOURCES.md; peak live checked by an independent computation).
// Gzip input, which needs zlib, is tested in readers_gzip.test.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <vram/trace/read_trace.hpp>

#include "support/real_traces.hpp"

using namespace std::string_literals;
using vram::test::check_consistent;
using vram::test::real;
using vram::test::shared;
using vram::trace::event;
using vram::trace::trace;

namespace {

std::string pickle_bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s += static_cast<char>(b);
  return s;
}

}  // namespace

TEST_CASE("rmm csv: allocs, frees, unknown frees, failures") {
  std::string csv =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,08:00:00.000001,allocate,0x1000,256,0x0\n"
      "1,08:00:00.000002,allocate,0x2000,512,0x7\n"
      "1,08:00:00.000003,free,0x1000,256,0x0\n"
      "1,08:00:00.000004,free,0x9000,128,0x0\n"  // never allocated: live at start
      "1,08:00:00.000005,allocate failure,0x0,99,0x0\n"
      "1,08:00:00.000006,free,zz,1,0x0\n";  // malformed
  trace t = vram::trace::parse_trace(csv, "log.csv");
  CHECK(t.format == "rmm-csv");
  CHECK(t.allocs() == 2);
  CHECK(t.frees() == 2);
  CHECK(t.initial_live == 1);
  CHECK(t.streams == 2);
  CHECK(t.warnings == 1);
  CHECK(t.peak_live_bytes() == 128 + 256 + 512);
  check_consistent(t);
}

TEST_CASE("rmm csv: the Tenant column names each allocation's tenant, its free too") {
  std::string csv =
      "Thread,Time,Action,Pointer,Size,Stream,Tenant\n"
      "1,08:00:00.000001,allocate,0x1000,256,0x0,serving/llama\n"
      "1,08:00:00.000002,allocate,0x2000,512,0x0,\"batch, nightly \"\"eu\"\"\"\n"
      "1,08:00:00.000003,allocate,0x3000,64,0x0,\n"
      "1,08:00:00.000004,free,0x1000,256,0x0,someone else\n"  // the free is the allocation's tenant's
      "1,08:00:00.000005,allocate,0x4000,128,0x0,serving/llama\n";
  trace t = vram::trace::parse_trace(csv, "tenants.csv");
  REQUIRE(t.tenants.size() == 3);
  CHECK(t.tenants[0].empty());
  CHECK(t.tenants[1] == "serving/llama");
  CHECK(t.tenants[2] == "batch, nightly \"eu\"");
  std::vector<std::uint16_t> of;
  for (const auto& e : t.events) of.push_back(e.tenant);
  CHECK(of == std::vector<std::uint16_t>{1, 2, 0, 1, 1});
  CHECK(t.warnings == 0);
  // Without the column: no tenants.
  CHECK(vram::trace::parse_trace("Action,Pointer,Size\nallocate,0x10,64\n", "plain.csv").tenants.empty());
}

TEST_CASE("lifetime csv: half-open intervals") {
  trace t = vram::trace::parse_trace("id,lower,upper,size\n0,0,2,100\n1,2,3,50\n2,1,3,10\n3,5,5,7\n", "l.csv");
  CHECK(t.format == "lifetime-csv");
  CHECK(t.allocs() == 3);
  CHECK(t.frees() == 3);
  CHECK(t.warnings == 1);  // the empty lifetime
  CHECK(t.peak_live_bytes() == 110);  // buffer 0 ends at step 2, before buffer 1 starts
  check_consistent(t);
  CHECK_THROWS_AS(vram::trace::parse_trace("id,lower,upper\n", "bad.csv"), vram::trace::trace_error);
}

TEST_CASE("kineto json: memory events of one CUDA device") {
  std::string json = R"({"schemaVersion":1,"traceEvents":[
    {"name":"[memory]","ph":"i","ts":1.5,"args":{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":512,"Total Reserved":2097152}},
    {"name":"[memory]","ph":"i","ts":2,"args":{"Device Type":0,"Device Id":-1,"Addr":77,"Bytes":64}},
    {"name":"aten::mm","ph":"X","ts":2,"dur":3,"args":{"a":[1,2,{"b":"\u00e9"}]}},
    {"name":"[memory]","ph":"i","ts":3,"args":{"Device Type":1,"Device Id":0,"Addr":8192,"Bytes":-1024,"Total Reserved":4194304}},
    {"name":"[memory]","ph":"i","ts":4,"args":{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":-512,"Total Reserved":4194304}}
  ],"deviceProperties":[]})";
  trace t = vram::trace::parse_trace(json, "k.json");
  CHECK(t.format == "kineto");
  CHECK(t.allocs() == 1);
  CHECK(t.frees() == 2);
  CHECK(t.initial_live == 1);
  CHECK(t.peak_live_bytes() == 1536);
  REQUIRE(t.recorded_peak_reserved);
  CHECK(*t.recorded_peak_reserved == 4194304);
  check_consistent(t);
  SECTION("malformed JSON names the offset") {
    try {
      vram::trace::parse_trace(R"({"traceEvents":[{"name":"[memory]",}]})", "bad.json");
      FAIL("no error");
    } catch (const vram::trace::trace_error& e) {
      CHECK(std::string(e.what()).find("bad.json") != std::string::npos);
      CHECK(std::string(e.what()).find("byte 35") != std::string::npos);
    }
    CHECK_THROWS_AS(vram::trace::parse_trace(R"({"traceEvents":[)", "t.json"), vram::trace::trace_error);
    CHECK_THROWS_AS(vram::trace::parse_trace(std::string(100000, '['), "deep.json"), vram::trace::trace_error);
    CHECK_THROWS_AS(vram::trace::parse_trace(R"({"other":1})", "o.json"), vram::trace::trace_error);
    // Skimmed (non-memory) events are still checked for brackets and strings.
    CHECK_THROWS_AS(vram::trace::parse_trace(R"({"traceEvents":[{"name":"x","args":[1}]})", "m.json"),
                    vram::trace::trace_error);
    CHECK_THROWS_AS(vram::trace::parse_trace(R"({"traceEvents":[{"name":"x\"}]})", "s.json"), vram::trace::trace_error);
  }
}

TEST_CASE("vram trace format round trip") {
  std::string text =
      "# vram-trace 1\nop,id,bytes,stream,time_ns\nL,7,100,0,0\nR,,1000,,\nA,1,50,1,10\nF,7,100,0,20\nR,,2000,,\nF,1,50,1,30\nF,9,1,0,40\n";
  trace t = vram::trace::parse_trace(text, "v.trace");
  CHECK(t.format == "vram-trace");
  CHECK(t.initial_live == 1);
  CHECK(t.allocs() == 1);
  CHECK(t.frees() == 2);
  CHECK(t.warnings == 1);
  CHECK(t.streams == 2);
  CHECK(*t.recorded_peak_reserved == 2000);
  std::ostringstream out;
  vram::trace::write_vram_trace(out, t);
  trace u = vram::trace::parse_trace(out.str(), "v2.trace");
  CHECK(u.events.size() == t.events.size());
  CHECK(u.initial_live == t.initial_live);
  CHECK(u.recorded_reserved.size() == 2);
  CHECK(u.recorded_reserved[1].event_index == t.recorded_reserved[1].event_index);
  check_consistent(u);
}

TEST_CASE("unknown and gzip-corrupt inputs give clear errors") {
  CHECK_THROWS_AS(vram::trace::parse_trace("hello\n", "x"), vram::trace::trace_error);
  CHECK_THROWS_AS(vram::trace::parse_trace(pickle_bytes({0x1f, 0x8b, 8, 0, 0, 0}), "x.gz"), vram::trace::trace_error);
  CHECK_THROWS_AS(vram::trace::read_trace("/nonexistent/file"), vram::trace::trace_error);
}

TEST_CASE("line-based traces none of whose rows can be read are errors naming the first bad line") {
  auto error_of = [](const std::string& data, const std::string& name) -> std::string {
    try {
      vram::trace::parse_trace(data, name);
    } catch (const vram::trace::trace_error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of("Thread,Time,Action,Pointer,Size,Stream\n\n1,0,allocate,zz,256,0\n1,0,allocate,0x10\n", "r.csv") ==
        "r.csv: line 3: invalid Pointer or Size; no row of the file could be read (2 rows)");
  CHECK(error_of("Thread,Time,Action,Pointer,Size\n1,0,resize,0x10,1\n", "u.csv") ==
        "u.csv: line 2: unknown action; no row of the file could be read (1 row)");
  CHECK(error_of("id,lower,upper,size\n1;0;2;100\nx,0,2,100\n", "l.csv") ==
        "l.csv: line 2: malformed row; no row of the file could be read (2 rows)");
  CHECK(error_of("# vram-trace 1\nop,id,bytes,stream,time_ns\n# note\nA,1,-5,0,0\nQ,1,5,0,0\n", "v.trace") ==
        "v.trace: line 4: malformed row; no row of the file could be read (2 rows)");
  // One readable row is enough: the others stay counted warnings.
  trace t = vram::trace::parse_trace("id,lower,upper,size\nx,0,2,100\n1,0,2,100\n", "l.csv");
  CHECK(t.allocs() == 1);
  CHECK(t.warnings == 1);
  // A header without rows, and rows that read but describe nothing, are not errors.
  CHECK(vram::trace::parse_trace("id,lower,upper,size\n", "h.csv").events.empty());
  CHECK(vram::trace::parse_trace("id,lower,upper,size\n1,3,3,100\n", "e.csv").warnings == 1);
  CHECK(vram::trace::parse_trace("Thread,Time,Action,Pointer,Size\n1,0,allocate failure,0x0,9\n", "f.csv").events.empty());
}

TEST_CASE("a UTF-8 byte order mark before any text trace is skipped") {
  const std::string bom = "\xEF\xBB\xBF";
  trace rmm = vram::trace::parse_trace(bom + "Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,64,0\n", "b.csv");
  CHECK(rmm.format == "rmm-csv");
  CHECK(rmm.allocs() == 1);
  trace lifetimes = vram::trace::parse_trace(bom + "id,lower,upper,size\r\n0,0,2,100\r\n", "b.csv");
  CHECK(lifetimes.format == "lifetime-csv");
  CHECK(lifetimes.allocs() == 1);
  trace own = vram::trace::parse_trace(bom + "# vram-trace 1\nA,1,64,0,0\nF,1,64,0,1\n", "b.trace");
  CHECK(own.format == "vram-trace");
  CHECK(own.frees() == 1);
  CHECK(own.warnings == 0);
  std::string event = R"({"name":"[memory]","ph":"i","ts":1,"args":{"Device Type":1,"Addr":64,"Bytes":32}})";
  trace kineto = vram::trace::parse_trace(bom + R"({"traceEvents":[)" + event + "]}", "b.json");
  CHECK(kineto.format == "kineto");
  CHECK(kineto.allocs() == 1);
  CHECK(vram::trace::parse_trace(bom + "[" + event + "]", "b.json").allocs() == 1);
  // The readers called directly skip it too, and JSON errors still count bytes from the file's start.
  CHECK(vram::trace::read_rmm_csv(bom + "Action,Pointer,Size\nallocate,0x10,64\n", "b.csv").allocs() == 1);
  try {
    vram::trace::read_kineto(bom + R"({"traceEvents":[{"name":"[memory]",}]})", "bad.json");
    FAIL("no error");
  } catch (const vram::trace::trace_error& e) {
    CHECK(std::string(e.what()).find("byte 38") != std::string::npos);  // byte 35 without the mark
  }
}

TEST_CASE("restricted unpickler: built-in values only, hostile input refused") {
  // {'device_traces': [[{'action': 'alloc', 'addr': 4096, 'size': 10, 'stream': 0}]], 'segments': []}
  auto str = [](const std::string& s) { return "\x8c"s + static_cast<char>(s.size()) + s; };
  std::string ev = "}("s + str("action") + str("alloc") + str("addr") + "M\x00\x10"s + str("size") + "K\x0a"s +
                   str("stream") + "K\x00"s + "u";
  std::string good = "\x80\x04}("s + str("device_traces") + "]]" + ev + "aa" + str("segments") + "]u.";
  trace t = vram::trace::parse_trace(good, "s.pickle");
  CHECK(t.format == "pytorch-snapshot");
  CHECK(t.allocs() == 1);
  CHECK(t.peak_live_bytes() == 10);

  auto error_of = [](const std::string& data) -> std::string {
    try {
      vram::trace::parse_trace(data, "h.pickle");
    } catch (const vram::trace::trace_error& e) {
      return e.what();
    }
    return "";
  };
  SECTION("truncation at every byte is an error naming the file, never a crash") {
    for (std::size_t n = 1; n < good.size(); ++n) {
      std::string e = error_of(good.substr(0, n));
      INFO(n);
      CHECK(e.find("h.pickle") != std::string::npos);
    }
  }
  SECTION("globals and calls are refused") {
    CHECK(error_of("\x80\x04\x8c\x02os\x8c\x06system\x93."s).find("global") != std::string::npos);
    CHECK(error_of("\x80\x02\x63os\nsystem\n."s).find("byte 2") != std::string::npos);
    CHECK(error_of("\x80\x04N)R."s).find("refusing") != std::string::npos);
  }
  SECTION("wrong types, cycles and huge lengths") {
    CHECK(error_of("\x80\x04]\x94."s).find("not a PyTorch memory snapshot") != std::string::npos);  // a list, not a dict
    // a list that contains itself, as device_traces: no crash, no events
    std::string cyclic = "\x80\x04}("s + str("device_traces") + "]\x94h\x00"s + "au.";
    CHECK(error_of(cyclic) == "");
    CHECK(error_of("\x80\x04X\xff\xff\xff\x7f"s).find("truncated") != std::string::npos);
    CHECK(error_of("\x80\x04h\x05."s).find("memo") != std::string::npos);
    CHECK(error_of("\x80\x04Nr\xff\xff\xff\x7f."s).find("memo index out of range") != std::string::npos);
    CHECK(error_of("\x80\x04K\x01K\x02."s).find("STOP") != std::string::npos);
    CHECK(error_of("\x80\x04" "a."s).find("underflow") != std::string::npos);
    CHECK(error_of("\x80\x04K\x01" "a."s).find("underflow") != std::string::npos);
    CHECK(error_of("\x80\x04K\x01K\x02" "a."s).find("wrong type") != std::string::npos);
    // an event whose size is a string: a counted warning
    std::string bad_ev = "}("s + str("action") + str("alloc") + str("addr") + "K\x01"s + str("size") + str("ten") + "u";
    trace w = vram::trace::parse_trace("\x80\x04}("s + str("device_traces") + "]]" + bad_ev + "aau.", "w.pickle");
    CHECK(w.warnings == 1);
    CHECK(w.events.empty());
  }
}

// ---- the real traces ------------------------------------------------------------------

TEST_CASE("real: memory.pickle (PyTorch snapshot from process start)", "[traces]") {
  const trace& t = real("memory.pickle");
  CHECK(t.format == "pytorch-snapshot");
  CHECK(t.allocs() == 7946);
  CHECK(t.frees() == 7549);
  CHECK(t.initial_live == 0);
  CHECK(t.streams == 1);
  check_consistent(t);
  // SOURCES.md: net peak of live requested bytes 1.78 GB; ends with 1.90 GB reserved.
  CHECK(t.peak_live_bytes() == Approx(1.78e9).epsilon(0.01));
  REQUIRE(t.recorded_peak_reserved);
  CHECK(*t.recorded_peak_reserved == Approx(1.90e9).epsilon(0.01));
  CHECK(t.recorded_reserved.front().reserved_bytes == 0);
}

TEST_CASE("real: medium_1024 snapshot (window with blocks live at the start)", "[traces]") {
  const trace& t = real("medium_1024_training_memory_snapshot.pickle");
  CHECK(t.allocs() == 7591);
  CHECK(t.frees() == 7370);
  CHECK(t.initial_live > 0);
  check_consistent(t);
  std::uint64_t start = 0;
  for (std::size_t i = 0; i < t.initial_live; ++i) start += t.events[i].bytes;
  // SOURCES.md: the in-window peak is about 19.1 GB above the starting level; 25.2 GB reserved.
  CHECK(double(t.peak_live_bytes() - start) == Approx(19.1e9).epsilon(0.02));
  CHECK(*t.recorded_peak_reserved == Approx(25.2e9).epsilon(0.01));
}

TEST_CASE("real: pangu_2.6B.csv (lifetimes), peak checked by a sweep", "[traces]") {
  const trace& t = real("pangu_2.6B.csv");
  CHECK(t.allocs() == 18692);
  CHECK(t.frees() == 18692);
  check_consistent(t);
  // Independent: sweep the CSV rows directly with a step -> delta map.
  std::ifstream in(shared("pangu_2.6B.csv"));
  std::string line;
  std::getline(in, line);
  std::map<long long, long long> delta;
  while (std::getline(in, line)) {
    long long id, lo, hi, size;
    REQUIRE(std::sscanf(line.c_str(), "%lld,%lld,%lld,%lld", &id, &lo, &hi, &size) == 4);
    delta[lo] += size;
    delta[hi] -= size;
  }
  long long live = 0, peak = 0;
  for (auto [step, d] : delta) peak = std::max(peak, live += d);
  CHECK(t.peak_live_bytes() == static_cast<std::uint64_t>(peak));
  CHECK(double(peak) == Approx(5.53e9).epsilon(0.01));
}
