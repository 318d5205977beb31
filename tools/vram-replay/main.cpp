// vram-replay: which allocator fragments least on my workload, and why did I run out of
// memory at 54 of 80 GiB? Replays recorded traces (PyTorch snapshots, Kineto traces, RMM
// logs, lifetime CSVs, vram traces) or built-in workloads against vram's allocators on a
// simulated device of any capacity (or a real GPU with --device cuda). See docs/replay.md.

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <vram-replay/lineup.hpp>
#include <vram-replay/output_file.hpp>
#include <vram/core/bytes.hpp>
#include <vram/core/parse.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/read_trace_stream.hpp>
#include <vram/trace/repeat_steps.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/report.hpp>
#include <vram/trace/workloads.hpp>

#if VRAM_HAS_CUDA
#include <cuda_runtime_api.h>

#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_vmm_source.hpp>
#endif

namespace {

const char* usage =
    "usage: vram-replay [options] [TRACE...]\n"
    "\n"
    "Replays each TRACE (PyTorch snapshot .pickle, Kineto .json/.json.gz, RMM CSV log,\n"
    "lifetime CSV id,lower,upper,size, or a vram trace; detected from the content) against\n"
    "each allocator and prints peak live vs peak reserved bytes, OOMs, upstream calls and\n"
    "host ns per operation. Without TRACE it replays built-in workloads.\n"
    "\n"
    "options:\n"
    "  --allocators A,B,...  allocators to compare (default: all but slab; see --list)\n"
    "  --capacity BYTES      device capacity, e.g. 80G, 24GiB, 512M (powers of 1024; default 80G)\n"
    "  --device sim|cuda     simulated device (default) or the real GPU\n"
    "  --json FILE           write the figures as JSON\n"
    "  --html FILE           write a self-contained HTML report with plots\n"
    "  --write-trace FILE    write the (first) trace in vram's own format and exit\n"
    "  --no-timing           do not time each operation\n"
    "  --steps N             replay each trace as N repeated steps (a training loop): the\n"
    "                        first is learned by pool-planned, the later ones measured\n"
    "  --stream              read vram traces and RMM logs as streams (bounded memory;\n"
    "                        files over 256 MiB are always streamed)\n"
    "  --list                list the allocators and exit\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 replayed, 1 a trace could not be read or an output written, 2 a bad\n"
    "command line, 3 --device cuda without a usable GPU\n";

/// A device capacity (vram::parse_bytes), not 0.
std::size_t parse_capacity(const std::string& s) {
  std::optional<std::size_t> bytes = vram::parse_bytes(s);
  if (!bytes || *bytes == 0) throw std::invalid_argument(vram::refusal("--capacity", s, vram::size_grammar) + "; not 0");
  return *bytes;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    auto p = s.find(',', start);
    if (p == std::string::npos) p = s.size();
    if (p > start) out.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

#if VRAM_HAS_CUDA
/// cudaMalloc per allocation, counted (cuda_device_source keeps no statistics).
struct counted_cuda {
  vram::cuda_device_source source;
  vram::stats counters;
  void* allocate(vram::stream_ref s, std::size_t bytes, std::size_t align) {
    void* p = source.allocate(s, bytes, align);
    counters.reserved_bytes += bytes;
    counters.peak_reserved_bytes = std::max(counters.peak_reserved_bytes, counters.reserved_bytes);
    ++counters.upstream_allocations;
    return p;
  }
  void deallocate(vram::stream_ref s, void* p, std::size_t bytes, std::size_t align) noexcept {
    source.deallocate(s, p, bytes, align);
    counters.reserved_bytes -= bytes;
    ++counters.upstream_deallocations;
  }
  void* allocate_sync(std::size_t b, std::size_t a) { return allocate({}, b, a); }
  void deallocate_sync(void* p, std::size_t b, std::size_t a) noexcept { deallocate({}, p, b, a); }
  vram::stats stats() const { return counters; }
  friend bool operator==(const counted_cuda&, const counted_cuda&) noexcept { return true; }
};

/// One CUDA stream per trace stream, so the pools see the trace's streams as real streams
/// (frees keyed per stream, steals ordered by events). Synchronized and destroyed last.
struct cuda_streams {
  explicit cuda_streams(std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) {
      cudaStream_t s = nullptr;
      vram::detail::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      raw.push_back(s);
      refs.emplace_back(s);
    }
  }
  ~cuda_streams() {
    for (cudaStream_t s : raw)
      if (cudaStreamSynchronize(s) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess)
        std::cerr << "vram-replay: a CUDA stream could not be synchronized or destroyed: "
                  << cudaGetErrorString(cudaGetLastError()) << "\n";
  }
  cuda_streams(const cuda_streams&) = delete;
  cuda_streams& operator=(const cuda_streams&) = delete;
  std::vector<cudaStream_t> raw;
  std::vector<vram::stream_ref> refs;
};

std::vector<vram_replay::allocator_config> cuda_allocators() {
  using namespace vram::trace;
  using vram_replay::allocator_config;
  using vram_replay::all_allocators;
  using vram_replay::default_allocators;
  using vram_replay::find_allocator;
  return {{"cuda-pool-vmm", "stream_pool on cuda_vmm_source (virtual memory, grows in place)",
           [](const trace& t, const replay_options& o) {
             cuda_streams streams(t.streams);  // declared first: destroyed after the pool
             auto pool = std::make_unique<vram::stream_pool<vram::cuda_vmm_source>>(vram::cuda_vmm_source{},
                                                                                     vram::stream_pool_options{});
             auto r = replay(t, *pool, [&] { return pool->stats(); }, streams.refs, o);
             r.allocator = "cuda-pool-vmm";
             return r;
           }},
          {"cuda-pool", "stream_pool on cudaMalloc (cuda_device_source), 20 MiB growth",
           [](const trace& t, const replay_options& o) {
             cuda_streams streams(t.streams);
             auto pool = std::make_unique<vram::stream_pool<vram::cuda_device_source>>(
                 vram::cuda_device_source{}, vram::stream_pool_options{.growth_step = std::size_t{20} << 20});
             auto r = replay(t, *pool, [&] { return pool->stats(); }, streams.refs, o);
             r.allocator = "cuda-pool";
             return r;
           }},
          {"cuda-upstream", "cudaMalloc / cudaFree per allocation", [](const trace& t, const replay_options& o) {
             counted_cuda c;
             auto r = replay(t, c, [&] { return c.stats(); }, {}, o);
             r.allocator = "cuda-upstream";
             return r;
           }}};
}
#endif

/// The exit status once everything is printed: 1, with the reason, where standard output
/// could not be written (a full disk, a closed pipe).
int finish_stdout() {
  errno = 0;
  if (std::cout.flush() && std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return 0;
  std::cerr << "vram-replay: cannot write standard output: " << (errno != 0 ? std::strerror(errno) : "write error")
            << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace vram::trace;
  using vram_replay::allocator_config;
  using vram_replay::all_allocators;
  using vram_replay::default_allocators;
  using vram_replay::find_allocator;
  std::vector<std::string> files, wanted;
  std::string json_path, html_path, write_path, device = "sim";
  replay_options options;
  bool list = false, stream = false;
  int steps = 1;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + ": needs a value");
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        std::cout << usage;
        return 0;
      } else if (a == "--allocators") wanted = split_list(value());
      else if (a == "--capacity") options.capacity = parse_capacity(value());
      else if (a == "--device") device = value();
      else if (a == "--json") json_path = value();
      else if (a == "--html") html_path = value();
      else if (a == "--write-trace") write_path = value();
      else if (a == "--no-timing") options.time_operations = false;
      else if (a == "--list") list = true;
      else if (a == "--stream") stream = true;
      else if (a == "--steps") {
        std::string v = value();
        std::optional<std::uint64_t> n = vram::parse_count(v);
        if (!n || *n < 1 || *n > 1000) throw std::invalid_argument(vram::refusal("--steps", v, "a whole decimal number, 1 to 1000"));
        steps = static_cast<int>(*n);
      }
      else if (a.starts_with("-")) throw std::invalid_argument("unknown option " + vram::quoted(a));
      else files.push_back(a);
    }
    if (device != "sim" && device != "cuda")
      throw std::invalid_argument("--device: sim or cuda, not " + vram::quoted(device));
  } catch (const std::exception& e) {
    std::cerr << "vram-replay: " << e.what() << " (see vram-replay --help)\n";
    return 2;
  }

  std::vector<allocator_config> available;
  if (device == "cuda") {
#if VRAM_HAS_CUDA
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
      std::cerr << "vram-replay: --device cuda: no usable CUDA GPU on this machine (cudaGetDeviceCount: "
                << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices")
                << "); replay on the simulated device instead (the default, --device sim)\n";
      return 3;
    }
    available = cuda_allocators();
    std::cerr << "vram-replay: replaying on the real GPU (--capacity is ignored)\n";
#else
    std::cerr << "vram-replay: --device cuda: this vram-replay was built without CUDA\n";
    return 3;
#endif
  } else {
    available = all_allocators();
  }
  if (list) {
    for (const auto& c : available) std::cout << c.name << "\t" << c.description << "\n";
    return 0;
  }
  std::vector<allocator_config> configs;
  try {
    if (wanted.empty()) configs = device == "cuda" ? available : default_allocators();
    for (const auto& w : wanted) configs.push_back(find_allocator(available, w));
  } catch (const std::exception& e) {
    std::cerr << "vram-replay: " << e.what() << " (see vram-replay --help)\n";
    return 2;
  }

  std::vector<trace> traces;
  try {
    if (files.empty()) {
      std::cerr << "vram-replay: no trace given: replaying built-in workloads (see --help)\n";
      traces = builtin_workloads();
    }
    // Large files are replayed from the file, once per allocator, in the memory of their live
    // blocks (read_trace_stream.hpp); the rest are read once into memory.
    constexpr std::uintmax_t stream_above = std::uintmax_t{256} << 20;
    for (const auto& f : files) {
      std::error_code ec;
      std::uintmax_t size = std::filesystem::file_size(f, ec);
      traces.push_back(stream || (!ec && size > stream_above) ? read_trace_stream(f) : read_trace(f));
    }
    if (steps > 1)
      for (auto& t : traces) t = repeat_steps(t, steps);
  } catch (const std::exception& e) {
    std::cerr << "vram-replay: " << e.what() << "\n";
    return 1;
  }
  // Every output file is created before the replays, so a path that cannot be written fails
  // at once; each failure names the file and the system's reason.
  vram_replay::output_file trace_out(write_path), json_out(json_path), html_out(html_path);
  auto failed = [](const vram_replay::output_file& o) {
    std::cerr << "vram-replay: " << o.error() << "\n";
    return 1;
  };
  if (!write_path.empty()) {
    if (!trace_out.open()) return failed(trace_out);
    write_vram_trace(trace_out.stream(), traces.front());
    if (!trace_out.close()) return failed(trace_out);
    std::cout << "wrote " << write_path << " (" << traces.front().name << " in vram's trace format)\n";
    return finish_stdout();
  }
  for (auto* o : {&json_out, &html_out})
    if (!o->path().empty() && !o->open()) return failed(*o);

  bool tty = ::isatty(2) != 0;
  std::vector<std::pair<const trace*, std::vector<replay_result>>> runs;
  std::vector<replay_result> all;
  for (const auto& t : traces) {
    std::vector<replay_result> results;
    for (const auto& c : configs) {
      replay_options o = options;
      if (tty && t.size() > 100000)
        o.progress = [&](std::size_t done, std::size_t total) {
          std::fprintf(stderr, "\r%s / %s: %3zu%%", t.name.c_str(), c.name.c_str(), done * 100 / total);
        };
      try {
        results.push_back(c.run(t, o));
      } catch (const std::exception& e) {
        replay_result r;
        r.trace = t.name;
        r.allocator = c.name;
        r.error = std::string("failed: ") + e.what();
        results.push_back(r);
      }
      if (o.progress) std::fprintf(stderr, "\r\033[K");
    }
    print_table(std::cout, t, results);
    all.insert(all.end(), results.begin(), results.end());
    runs.emplace_back(&t, std::move(results));
  }
  if (!json_path.empty()) {
    write_json(json_out.stream(), all);
    if (!json_out.close()) return failed(json_out);
    std::cout << "wrote " << json_path << " (the figures as JSON)\n";
  }
  if (!html_path.empty()) {
    write_html(html_out.stream(), runs);
    if (!html_out.close()) return failed(html_out);
    std::cout << "wrote " << html_path << " (open it in a browser: live vs reserved over time, per allocator)\n";
  }
  return finish_stdout();
}
