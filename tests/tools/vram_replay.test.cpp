// The vram-replay executable, run as a user would: built-in workloads, the shared traces,
// --json / --html outputs, and clear errors for bad input.

#include <catch2/catch.hpp>

#include "support/real_traces.hpp"
#include "support/run_tool.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <vram/trace/detail/json.hpp>

#if VRAM_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef VRAM_REPLAY_EXE
#error "VRAM_REPLAY_EXE: tools/CMakeLists.txt defines it wherever vram-replay is built"
#endif

namespace {

using vram::test::run_result;

/// Runs vram-replay with `args`, capturing stdout and stderr.
run_result run(const std::string& args) { return vram::test::run_tool(VRAM_REPLAY_EXE, args); }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string traces() { return vram::test::traces_dir(); }

/// A scratch file name in the temp directory, unique to this process.
std::string scratch(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vram_replay_" + std::to_string(::getpid()) + "_" + name)).string();
}

/// A scratch file holding `content`; its path.
std::string scratch_file(const std::string& name, const std::string& content) {
  std::string path = scratch(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

}  // namespace

TEST_CASE("no arguments: built-in workloads, a real comparison") {
  auto r = run("");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("transformer-training") != std::string::npos);
  CHECK(r.out.find("kv-cache-inference") != std::string::npos);
  for (const char* a : {"pool-contiguous", "pool-segments", "arena", "upstream"}) CHECK(r.out.find(a) != std::string::npos);
  CHECK(r.out.find("lowest reserved: pool-contiguous") != std::string::npos);  // a verdict per trace
  // ... naming the C++ type to write, why, and what the others cost (which pool is fastest
  // within 1% of the fewest bytes depends on the run's timing: the recompute trace has one)
  CHECK(r.out.find("verdict: vram::stream_pool<vram::cuda_vmm_source> (pool-contiguous): 1.028 of peak live, the fewest "
                   "bytes reserved, ") != std::string::npos);
  CHECK(r.out.find("; the others: pool-segments ") != std::string::npos);
  CHECK(r.out.find("arena 4.614 at ") != std::string::npos);
  CHECK(r.out.find("(a bump allocator: each chunk is held until every block in it is freed") != std::string::npos);
  CHECK(r.out.find("(columns: docs/replay.md") != std::string::npos);
}

TEST_CASE("a slab's spill and an arena's OOMs are explained; outputs are announced", "[traces]") {
  std::string html = scratch("notes.html");
  auto r = run("--no-timing --allocators slab,arena,pool-contiguous --capacity 1G --html " + html + " '" + traces() +
               "/memory.pickle'");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("spilled") != std::string::npos);
  CHECK(r.out.find("(slab: peak reserved includes the ") != std::string::npos);
  CHECK(r.out.find("OOMs: an activation arena returns space only when everything above it is dead") != std::string::npos);
  CHECK(r.out.find("lowest reserved: slab") == std::string::npos);  // a run that spilled did not fit the device
  CHECK(r.out.find("wrote " + html) != std::string::npos);
  std::filesystem::remove(html);
}

TEST_CASE("shared traces with --json and --html", "[traces]") {
  std::string json = scratch("test.json"), html = scratch("test.html");
  auto r = run("--no-timing --allocators pool-contiguous,upstream --json " + json + " --html " + html + " '" +
               traces() + "/memory.pickle' '" + traces() + "/pangu_2.6B.csv'");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("7946 allocs, 7549 frees") != std::string::npos);
  CHECK(r.out.find("18692 allocs, 18692 frees") != std::string::npos);
  std::string text = slurp(json);
  vram::detail::trace::json_reader reader(text, json);
  auto doc = reader.parse_value();
  REQUIRE(doc.is_array());
  REQUIRE(doc.array.size() == 4);
  CHECK(doc.array[0].find("trace")->string == "memory.pickle");
  CHECK(doc.array[0].find("allocator")->string == "pool-contiguous");
  CHECK(doc.array[0].find("peak_live_bytes")->as_int() == 1783664516);
  CHECK(doc.array[0].find("recorded_reserved_bytes")->is_number());
  CHECK(doc.array[2].find("recorded_reserved_bytes")->is_null());  // lifetimes record no reserve
  std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("</html>") != std::string::npos);
  std::filesystem::remove(json);
  std::filesystem::remove(html);
}

TEST_CASE("replayed as steps (--steps N): each trace replayed as steps, pool-planned's plan beside the online pool", "[traces]") {
  std::string html = scratch("steps.html"), json = scratch("steps.json");
  auto r = run("--no-timing --steps 3 --allocators pool-contiguous,pool-planned --html " + html + " --json " + json +
               " '" + traces() + "/memory.pickle'");
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::string page = slurp(html);
  CHECK(page.find("Replayed as 3 steps; after the first") != std::string::npos);
  CHECK(page.find("pool-planned: plan of 7946 allocations") != std::string::npos);
  std::string text = slurp(json);
  vram::detail::trace::json_reader reader(text, json);
  auto doc = reader.parse_value();
  REQUIRE(doc.array.size() == 2);
  CHECK(doc.array[1].find("steps")->as_int() == 3);
  CHECK(doc.array[1].find("later_steps_reserved_per_live")->number < 1.01);
  CHECK(doc.array[1].find("note")->string.find("plan of 7946 allocations") == 0);
  std::filesystem::remove(html);
  std::filesystem::remove(json);
  CHECK(r.out.find("memory.pickle (3 steps)") != std::string::npos);
  CHECK(r.out.find("res/live 2+ pool-contiguous: ") != std::string::npos);
  CHECK(r.out.find("res/live 2+ pool-planned: 1.00") != std::string::npos);
  CHECK(r.out.find("(pool-planned: plan of 7946 allocations (7946 placed)") != std::string::npos);
  CHECK(r.out.find("served from the plan, 0 off it") != std::string::npos);
  for (const char* bad : {"--steps 0", "--steps x", "--steps 1001"}) {
    auto b = run(std::string(bad) + " '" + traces() + "/memory.pickle'");
    CHECK(b.status == 2);
    CHECK(b.out.find("bad --steps '" + std::string(bad).substr(8) + "': a whole decimal number, 1 to 1000") != std::string::npos);
  }
}

TEST_CASE("bad input: clear errors and exit codes, never a crash", "[traces]") {
  auto missing = run("/nonexistent.pickle");
  CHECK(missing.status == 1);
  CHECK(missing.out.find("/nonexistent.pickle: no such file") != std::string::npos);
  std::string dir = scratch("a-directory");
  std::filesystem::create_directories(dir);
  auto directory = run("'" + dir + "'");
  std::filesystem::remove(dir);
  CHECK(directory.status == 1);
  CHECK(directory.out.find("a-directory: is a directory, not a trace file") != std::string::npos);
  std::string empty = scratch("empty.csv");
  std::ofstream{empty};
  auto nothing = run("'" + empty + "'");
  std::filesystem::remove(empty);
  CHECK(nothing.status == 1);
  CHECK(nothing.out.find("empty.csv: empty file") != std::string::npos);
  auto option = run("--frobnicate");
  CHECK(option.status == 2);
  auto alloc = run("--allocators nope");
  CHECK(alloc.status == 2);
  CHECK(alloc.out.find("known: pool-contiguous") != std::string::npos);
  auto capacity = run("--capacity lots");
  CHECK(capacity.status == 2);
  std::string cut = scratch("truncated.pickle");
  std::ofstream(cut) << slurp(traces() + "/memory.pickle").substr(0, 5000);
  auto truncated = run("'" + cut + "'");
  std::filesystem::remove(cut);
  CHECK(truncated.status == 1);
  CHECK(truncated.out.find("truncated.pickle: pickle: at byte") != std::string::npos);
}

TEST_CASE("a CSV none of whose rows can be read is an error naming the first bad line") {
  for (const auto& [content, error] : {std::pair<std::string, std::string>{
                                           "Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0xZZ,256,0\n1,0,allocate,0x10,-1,0\n",
                                           ": line 2: invalid Pointer or Size; no row of the file could be read (2 rows)\n"},
                                       {"id,lower,upper,size\n0,0,oops,100\n",
                                        ": line 2: malformed row; no row of the file could be read (1 row)\n"}}) {
    std::string csv = scratch_file("unreadable.csv", content);
    auto r = run("--no-timing '" + csv + "'");
    std::filesystem::remove(csv);
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out == "vram-replay: " + csv + error);  // that line alone: no table
  }
}

TEST_CASE("a text trace that starts with a UTF-8 byte order mark is read") {
  std::string csv = scratch_file("bom.csv", "\xEF\xBB\xBFid,lower,upper,size\r\n0,0,2,1048576\r\n1,1,3,1048576\r\n");
  auto r = run("--no-timing --allocators upstream '" + csv + "'");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("bom.csv (lifetime-csv): 2 allocs, 2 frees") != std::string::npos);
  CHECK(r.out.find("warning") == std::string::npos);
  std::filesystem::remove(csv);
}

TEST_CASE("--stream replays a vram trace from its file with the same table") {
  std::string written = scratch("workloads.vtrace");
  REQUIRE(run("--write-trace '" + written + "'").status == 0);
  auto held = run("--no-timing '" + written + "'"), streamed = run("--no-timing --stream '" + written + "'");
  CHECK(held.status == 0);
  CHECK(streamed.status == 0);
  CHECK(streamed.out == held.out);
  CHECK(streamed.out.find("lowest reserved: ") != std::string::npos);
  std::filesystem::remove(written);
}

TEST_CASE("an output file that cannot be written: its name, the system's reason, exit 1") {
  std::string trace = scratch_file("small.vtrace", "# vram-trace 1\nA,1,4096,0,0\nF,1,4096,0,1\n");
  std::string dir = scratch("out-dir");
  std::filesystem::create_directories(dir);
  struct expectation {
    std::string option, path, message;
  };
  for (const auto& [option, path, message] :
       {expectation{"--json", "/nonexistent-dir/out.json", "cannot create /nonexistent-dir/out.json: No such file or directory"},
        expectation{"--html", dir, "cannot create " + dir + ": Is a directory"},
        expectation{"--json", "/dev/full", "cannot write /dev/full: No space left on device"},
        expectation{"--html", "/dev/full", "cannot write /dev/full: No space left on device"},
        expectation{"--write-trace", "/dev/full", "cannot write /dev/full: No space left on device"},
        expectation{"--write-trace", "/nonexistent-dir/t.vtrace", "cannot create /nonexistent-dir/t.vtrace: No such file or directory"}}) {
    auto r = run("--no-timing --allocators upstream " + option + " '" + path + "' '" + trace + "'");
    INFO(option << " " << path << "\n" << r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("vram-replay: " + message + "\n") != std::string::npos);
    CHECK(r.out.find("wrote") == std::string::npos);
  }
  // A path that cannot be created fails before any replay.
  auto early = run("--no-timing --json /nonexistent-dir/out.json '" + trace + "'");
  CHECK(early.out.find("==") == std::string::npos);
  // Standard output too.
  std::string err = scratch("stderr.txt");
  int status = std::system(("'" + std::string(VRAM_REPLAY_EXE) + "' --no-timing '" + trace + "' > /dev/full 2> '" + err + "'").c_str());
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(slurp(err) == "vram-replay: cannot write standard output: No space left on device\n");
  for (const auto& f : {trace, dir, err}) std::filesystem::remove(f);
}

TEST_CASE("--device cuda: replays on the GPU where there is one, says why not where there is none") {
  std::string trace = scratch_file("gpu.vtrace", "# vram-trace 1\nA,1,1048576,0,0\nA,2,4096,0,1\nF,1,1048576,0,2\nF,2,4096,0,3\n");
  auto r = run("--device cuda --no-timing '" + trace + "'");
  std::filesystem::remove(trace);
  INFO(r.out);
#if VRAM_HAS_CUDA
  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc == cudaSuccess && devices > 0) {
    INFO(devices << " CUDA device(s) here: the replay must run on them");
    CHECK(r.status == 0);
    CHECK(r.out.find("vram-replay: replaying on the real GPU") != std::string::npos);
    CHECK(r.out.find("gpu.vtrace (vram-trace): 2 allocs, 2 frees") != std::string::npos);
    for (const char* a : {"cuda-pool-vmm ", "cuda-pool ", "cuda-upstream "}) CHECK(r.out.find(std::string("\n") + a) != std::string::npos);
    CHECK(r.out.find("failed:") == std::string::npos);
    CHECK(r.out.find("lowest reserved: cuda-") != std::string::npos);
  } else {
    INFO("no usable CUDA GPU here: the tool must say so, and why");
    CHECK(r.status == 3);
    CHECK(r.out == std::string("vram-replay: --device cuda: no usable CUDA GPU on this machine (cudaGetDeviceCount: ") +
                       (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") +
                       "); replay on the simulated device instead (the default, --device sim)\n");
  }
#else
  CHECK(r.status == 3);
  CHECK(r.out == "vram-replay: --device cuda: this vram-replay was built without CUDA\n");
#endif
}
