// A strict stand-in for the part of the CUDA runtime and driver that vram calls, on host
// memory and host threads, so every host-side CUDA path of vram runs on machines without a
// GPU. Test-only: built as a shared library under tests/, linked instead of libcudart by the
// `*.standin` tests; never installed, never linked into the library.
//
// What it models:
// - Device memory: one reservation of VRAM_STANDIN_CAPACITY bytes (default 80 GiB) of
//   address space, PROT_NONE and never touched until allocated; an allocation is made
//   readable and writable, a free makes it inaccessible again (a use after free faults, as
//   it may on a GPU), and cudaMemGetInfo reports the capacity left, so out-of-memory is real.
// - Streams: each stream an in-order queue run by its own thread (a copy, a memset or a host
//   function is a task), so stream order is real and a missing wait shows as a race. The
//   legacy default stream synchronizes with every blocking stream, as the CUDA programming
//   guide describes; cudaStreamNonBlocking streams do not.
// - Events, cross-stream waits, cudaLaunchHostFunc, stream-ordered allocation with
//   cudaMemPool_t (release threshold, reserved and used figures and their high-water marks,
//   trim), mapped pinned memory, managed memory, pointer attributes, devices
//   (VRAM_STANDIN_DEVICES, default 1), the sticky-free last error, and the driver's VMM entry
//   points as cudaGetDriverEntryPointByVersion hands them out.
//
// Stricter than CUDA where CUDA's own documentation says a call is invalid but a real driver
// might not notice: each refusal names the rule it follows. It counts every call
// (standin.h), counts the calls that block the caller until device work completes, fails the
// Nth call of any function on request, and reports what is still held (leaks), on request and
// at exit.
//
// What it cannot show: device-side races and kernels (there are none), real timings, driver
// bugs, and the interaction of several processes with one device.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "standin.h"

// ---- streams and events ---------------------------------------------------------------------

/// An in-order queue of host tasks run by one thread. Tickets number the tasks: task n is
/// done when done() >= n. Invariant: done() <= tail().
struct CUstream_st {
  explicit CUstream_st(unsigned int f, bool legacy_stream = false) : flags(f), legacy(legacy_stream) {
    worker = std::thread([this] { run(); });
  }
  ~CUstream_st() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    worker.join();
  }

  std::uint64_t enqueue(std::function<void()> task) {
    std::lock_guard lock(mutex);
    tasks.push_back(std::move(task));
    wake.notify_all();
    return ++enqueued;
  }
  [[nodiscard]] std::uint64_t tail() {
    std::lock_guard lock(mutex);
    return enqueued;
  }
  [[nodiscard]] std::uint64_t done() {
    std::lock_guard lock(mutex);
    return completed;
  }
  void wait_for(std::uint64_t ticket) {
    std::unique_lock lock(mutex);
    finished.wait(lock, [&] { return completed >= ticket; });
  }

  const unsigned int flags;
  const bool legacy;

 private:
  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || !tasks.empty(); });
      if (tasks.empty()) return;  // stopping, and everything ran
      auto task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++completed;
      finished.notify_all();
    }
  }

  std::mutex mutex;
  std::condition_variable wake, finished;
  std::deque<std::function<void()>> tasks;
  std::uint64_t enqueued = 0, completed = 0;
  bool stopping = false;
  std::thread worker;
};

/// A position in a stream: complete when the stream has run every task enqueued before it.
struct CUevent_st {
  CUstream_st* stream = nullptr;  // nullptr: never recorded (complete, as CUDA defines it)
  std::uint64_t ticket = 0;
};

struct CUmemPoolHandle_st {
  int device = 0;
  std::uint64_t release_threshold = 0;
  std::uint64_t used = 0, used_high = 0;
  std::uint64_t kept = 0;  // freed bytes the pool keeps (reserved = used + kept)
  std::uint64_t reserved_high = 0;
};

namespace {

thread_local bool in_host_function = false;  // inside a cudaLaunchHostFunc callback
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

enum class kind { device, pool, pinned, managed };

struct allocation {
  std::size_t bytes;     // as asked
  std::size_t mapped;    // rounded to pages
  kind what;
  int device;
  CUmemPoolHandle_st* pool;  // kind::pool
  bool freeing = false;      // a cudaFreeAsync is pending
};

struct vmm_handle {
  std::size_t bytes;
  int device;
  CUdeviceptr mapped_at = 0;  // 0: not mapped
};

struct reservation {
  std::size_t bytes;
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> mappings;  // address -> handle
  std::set<CUdeviceptr> accessible;                              // mappings with access set
};

constexpr std::size_t page = 4096;
constexpr std::size_t vmm_granularity = std::size_t{2} << 20;

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? static_cast<std::size_t>(std::strtoull(v, nullptr, 0)) : fallback;
}

/// Everything the stand-in holds, created on first use and never destroyed (streams' threads
/// may still run at exit; the leak report is asked for explicitly).
struct state {
  state()
      : capacity((env_size("VRAM_STANDIN_CAPACITY", std::size_t{80} << 30) + page - 1) / page * page),
        devices(static_cast<int>(env_size("VRAM_STANDIN_DEVICES", 1))) {
    void* p = mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("cuda stand-in: reserving the device's address space");
      std::abort();
    }
    base = reinterpret_cast<std::uintptr_t>(p);
    free_ranges.emplace(0, capacity);
    legacy = new CUstream_st(0, true);
    for (int d = 0; d < devices; ++d) {
      auto* pool = new CUmemPoolHandle_st;
      pool->device = d;
      default_pools.push_back(pool);
    }
  }

  std::recursive_mutex mutex;  // everything below (streams run tasks that take it too)
  const std::size_t capacity;
  const int devices;
  std::uintptr_t base = 0;
  std::size_t used = 0;  // device bytes: cudaMalloc, pools, cuMemCreate (rounded to pages)
  std::map<std::size_t, std::size_t> free_ranges;  // offset -> bytes in the device reservation
  std::map<std::uintptr_t, allocation> allocations;
  std::unordered_map<CUmemGenericAllocationHandle, vmm_handle> handles;
  CUmemGenericAllocationHandle next_handle = 1;
  std::map<CUdeviceptr, reservation> reservations;
  std::set<CUstream_st*> streams;  // live, created ones (not the legacy or per-thread ones)
  std::set<CUevent_st*> events;
  std::set<CUmemPoolHandle_st*> pools;  // created ones
  std::vector<CUmemPoolHandle_st*> default_pools;
  CUstream_st* legacy = nullptr;
  std::vector<CUstream_st*> per_thread;  // each thread's cudaStreamPerThread
  // Destroyed handles, kept so that no later handle reuses their address (and so that leak
  // checkers see them reachable: their threads may still be running their last work).
  std::vector<CUstream_st*> destroyed_streams;
  std::vector<CUevent_st*> destroyed_events;
  std::vector<CUmemPoolHandle_st*> destroyed_pools;

  std::map<std::string, std::size_t> calls;
  std::atomic<std::size_t> blocking{0};
  std::string fail_name;
  std::size_t fail_countdown = 0;
};

state& S() {
  static state* s = [] {
    auto* created = new state;
    // At exit, what is still held is reported (to stderr; the exit status is the test's).
    std::atexit([] { (void)vram_standin_leaks(1); });
    return created;
  }();
  return *s;
}

// ---- bookkeeping shared by every entry point ------------------------------------------------

/// Counts the call; true when the fault plan says this call fails.
bool enter(const char* name) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  ++s.calls[name];
  if (s.fail_countdown != 0 && s.fail_name == name && --s.fail_countdown == 0) return true;
  return false;
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

/// CUDA Runtime API, "cudaLaunchHostFunc": "The host function must not make any CUDA API
/// calls. Attempting to use a CUDA API may result in cudaErrorNotPermitted".
#define STANDIN_ENTER(name, exhausted)                                   \
  do {                                                                   \
    if (in_host_function) return fail(cudaErrorNotPermitted);            \
    if (enter(name)) return fail(exhausted);                             \
  } while (0)

CUstream_st* per_thread_stream() {
  thread_local CUstream_st* mine = nullptr;
  if (mine == nullptr) {
    mine = new CUstream_st(0);
    auto& s = S();
    std::lock_guard lock(s.mutex);
    s.per_thread.push_back(mine);
  }
  return mine;
}

/// A call that names a destroyed stream or event: CUDA leaves it undefined, and a GPU's driver
/// crashes on it (SIGSEGV in cudaEventRecord on a destroyed stream), so the stand-in stops the
/// program here, loudly, rather than return an error a caller may swallow.
[[noreturn]] void destroyed_handle(const char* what, const void* h) {
  std::fprintf(stderr, "cuda stand-in: a call named a destroyed %s (%p): undefined in CUDA, a crash on a GPU\n", what, h);
  std::abort();
}

/// The stream a handle names, or nullptr when the handle is not a stream (an invalid resource
/// handle); a destroyed stream stops the program (destroyed_handle).
CUstream_st* resolve(cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy) return S().legacy;
  if (h == cudaStreamPerThread) return per_thread_stream();
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (s.streams.count(h) != 0) return h;
  if (std::find(s.destroyed_streams.begin(), s.destroyed_streams.end(), h) != s.destroyed_streams.end())
    destroyed_handle("stream", h);
  return nullptr;
}

/// Enqueues `task` on `st` in CUDA's default-stream order (programming guide, "Default
/// Stream" / "Implicit Synchronization"): work on the legacy stream waits for all work
/// already enqueued on blocking streams, and work on a blocking stream waits for the legacy
/// stream's. Returns the task's ticket.
std::uint64_t submit(CUstream_st* st, std::function<void()> task) {
  auto& s = S();
  std::vector<std::pair<CUstream_st*, std::uint64_t>> before;
  {
    std::lock_guard lock(s.mutex);
    if (st->legacy) {
      for (CUstream_st* o : s.streams)
        if ((o->flags & cudaStreamNonBlocking) == 0) before.emplace_back(o, o->tail());
      for (CUstream_st* o : s.per_thread) before.emplace_back(o, o->tail());
    } else if ((st->flags & cudaStreamNonBlocking) == 0) {
      before.emplace_back(s.legacy, s.legacy->tail());
    }
  }
  return st->enqueue([before = std::move(before), task = std::move(task)] {
    for (auto [o, ticket] : before) o->wait_for(ticket);
    task();
  });
}

void block_on(CUstream_st* st, std::uint64_t ticket) {
  ++S().blocking;
  st->wait_for(ticket);
}

/// The live allocation holding [p, p + n), if any (pre: the mutex held).
allocation* find_allocation(std::uintptr_t p, std::size_t n) {
  auto& s = S();
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  if (p < it->first || p + n > it->first + it->second.bytes || it->second.freeing) return nullptr;
  return &it->second;
}

/// True when [p, p + n) is VMM memory mapped with access set (pre: the mutex held).
bool vmm_accessible(std::uintptr_t p, std::size_t n) {
  auto& s = S();
  for (auto& [at, r] : s.reservations) {
    if (p < at || p >= at + r.bytes) continue;
    for (std::uintptr_t a = p / vmm_granularity * vmm_granularity; a < p + n; a += vmm_granularity)
      if (r.accessible.count(a) == 0) return false;
    return true;
  }
  return false;
}

/// Device memory from the reservation: first fit, page-aligned, made accessible.
void* take_device(std::size_t bytes) {
  auto& s = S();
  std::size_t rounded = (bytes + page - 1) / page * page;
  if (s.used + rounded > s.capacity) return nullptr;
  for (auto it = s.free_ranges.begin(); it != s.free_ranges.end(); ++it) {
    if (it->second < rounded) continue;
    std::size_t offset = it->first, left = it->second - rounded;
    s.free_ranges.erase(it);
    if (left != 0) s.free_ranges.emplace(offset + rounded, left);
    void* p = reinterpret_cast<void*>(s.base + offset);
    if (mprotect(p, rounded, PROT_READ | PROT_WRITE) != 0) std::abort();
    s.used += rounded;
    return p;
  }
  return nullptr;
}

void give_device(void* p, std::size_t rounded) {
  auto& s = S();
  madvise(p, rounded, MADV_DONTNEED);
  mprotect(p, rounded, PROT_NONE);  // a use after free faults
  std::size_t offset = reinterpret_cast<std::uintptr_t>(p) - s.base;
  auto next = s.free_ranges.lower_bound(offset);
  if (next != s.free_ranges.end() && offset + rounded == next->first) {
    rounded += next->second;
    next = s.free_ranges.erase(next);
  }
  if (next != s.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += rounded;
      return;
    }
  }
  s.free_ranges.emplace_hint(next, offset, rounded);
}

/// Frees an allocation record and its memory (pre: the mutex held).
void release_allocation(std::uintptr_t at) {
  auto& s = S();
  auto it = s.allocations.find(at);
  allocation a = it->second;
  s.allocations.erase(it);
  void* p = reinterpret_cast<void*>(at);
  switch (a.what) {
    case kind::device:
      s.used -= a.mapped;
      give_device(p, a.mapped);
      break;
    case kind::pool:
      s.used -= a.mapped;
      give_device(p, a.mapped);
      a.pool->used -= a.mapped;
      a.pool->kept += a.mapped;
      if (a.pool->kept > a.pool->release_threshold) a.pool->kept = a.pool->release_threshold;
      break;
    case kind::pinned:
    case kind::managed: munmap(p, a.mapped); break;
  }
}

void* take_host(std::size_t bytes, std::size_t* mapped) {
  *mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

/// The whole device, including work enqueued by threads now: every live stream and the
/// default ones.
void synchronize_all() {
  auto& s = S();
  std::vector<std::pair<CUstream_st*, std::uint64_t>> all;
  {
    std::lock_guard lock(s.mutex);
    for (CUstream_st* o : s.streams) all.emplace_back(o, o->tail());
    for (CUstream_st* o : s.per_thread) all.emplace_back(o, o->tail());
    all.emplace_back(s.legacy, s.legacy->tail());
  }
  for (auto [o, t] : all) o->wait_for(t);
}

}  // namespace

// ---- errors -----------------------------------------------------------------------------------

extern "C" {

cudaError_t CUDARTAPI cudaGetLastError(void) {
  if (in_host_function) return cudaErrorNotPermitted;
  enter("cudaGetLastError");
  return std::exchange(last_error, cudaSuccess);
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  if (in_host_function) return cudaErrorNotPermitted;
  enter("cudaPeekAtLastError");
  return last_error;
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define NAME(x) \
  case x: return #x;
    NAME(cudaSuccess) NAME(cudaErrorInvalidValue) NAME(cudaErrorMemoryAllocation) NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorInvalidResourceHandle) NAME(cudaErrorNotReady) NAME(cudaErrorNotPermitted)
    NAME(cudaErrorNotSupported) NAME(cudaErrorUnknown) NAME(cudaErrorInsufficientDriver) NAME(cudaErrorSymbolNotFound)
    NAME(cudaErrorNoDevice) NAME(cudaErrorIllegalAddress) NAME(cudaErrorInvalidDevicePointer)
#undef NAME
    default: return "cudaErrorUnrecognized";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {  // the runtime's own wording
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    default: return "unknown error";
  }
}

// ---- devices ----------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  STANDIN_ENTER("cudaGetDeviceCount", cudaErrorUnknown);
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = S().devices;
  return S().devices == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  STANDIN_ENTER("cudaGetDevice", cudaErrorUnknown);
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  STANDIN_ENTER("cudaSetDevice", cudaErrorUnknown);
  if (device < 0 || device >= S().devices) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

/// Only the attributes vram and its tests read; any other is refused rather than invented.
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  STANDIN_ENTER("cudaDeviceGetAttribute", cudaErrorUnknown);
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= S().devices) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMemoryPoolsSupported:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrManagedMemory:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrCanMapHostMemory: *value = 1; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);
  }
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  STANDIN_ENTER("cudaDeviceSynchronize", cudaErrorUnknown);
  ++S().blocking;
  synchronize_all();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  STANDIN_ENTER("cudaMemGetInfo", cudaErrorUnknown);
  if (free_bytes == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  *total = s.capacity;
  *free_bytes = s.capacity - s.used;
  return cudaSuccess;
}

// ---- memory -----------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaMalloc(void** p, size_t bytes) {
  STANDIN_ENTER("cudaMalloc", cudaErrorMemoryAllocation);
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  auto& s = S();
  std::lock_guard lock(s.mutex);
  void* q = take_device(bytes);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  s.allocations[reinterpret_cast<std::uintptr_t>(q)] = {bytes, (bytes + page - 1) / page * page, kind::device,
                                                       current_device, nullptr};
  *p = q;
  return cudaSuccess;
}

/// cudaFree "implicitly synchronizes the device" (runtime API, cudaFree); a pointer that is
/// not a live cudaMalloc / cudaMallocManaged allocation (foreign, already freed, or from a
/// pool) is cudaErrorInvalidValue.
cudaError_t CUDARTAPI cudaFree(void* p) {
  STANDIN_ENTER("cudaFree", cudaErrorUnknown);
  if (p == nullptr) return cudaSuccess;
  ++S().blocking;
  synchronize_all();
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.allocations.end() || it->second.freeing ||
      (it->second.what != kind::device && it->second.what != kind::managed))
    return fail(cudaErrorInvalidValue);
  release_allocation(it->first);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocManaged(void** p, size_t bytes, unsigned int flags) {
  STANDIN_ENTER("cudaMallocManaged", cudaErrorMemoryAllocation);
  // Runtime API, cudaMallocManaged: size 0 and flags other than cudaMemAttachGlobal or
  // cudaMemAttachHost are cudaErrorInvalidValue.
  if (p == nullptr || bytes == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return fail(cudaErrorInvalidValue);
  std::size_t mapped = 0;
  void* q = take_host(bytes, &mapped);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.allocations[reinterpret_cast<std::uintptr_t>(q)] = {bytes, mapped, kind::managed, current_device, nullptr};
  *p = q;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  STANDIN_ENTER("cudaHostAlloc", cudaErrorMemoryAllocation);
  constexpr unsigned int known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (p == nullptr || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  std::size_t mapped = 0;
  void* q = take_host(bytes, &mapped);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.allocations[reinterpret_cast<std::uintptr_t>(q)] = {bytes, mapped, kind::pinned, current_device, nullptr};
  *p = q;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  STANDIN_ENTER("cudaFreeHost", cudaErrorUnknown);
  if (p == nullptr) return cudaSuccess;
  ++S().blocking;
  synchronize_all();  // like cudaFree, it waits for the device
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.allocations.end() || it->second.what != kind::pinned) return fail(cudaErrorInvalidValue);
  release_allocation(it->first);
  return cudaSuccess;
}

/// Runtime API, cudaHostGetDevicePointer: "flags provided for future releases. For now, it
/// must be set to 0"; the pointer must be in pinned host memory. With unified addressing the
/// device pointer equals the host pointer.
cudaError_t CUDARTAPI cudaHostGetDevicePointer(void** device_ptr, void* host, unsigned int flags) {
  STANDIN_ENTER("cudaHostGetDevicePointer", cudaErrorUnknown);
  if (device_ptr == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  allocation* a = find_allocation(reinterpret_cast<std::uintptr_t>(host), 1);
  if (a == nullptr || a->what != kind::pinned) return fail(cudaErrorInvalidValue);
  *device_ptr = host;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* ptr) {
  STANDIN_ENTER("cudaPointerGetAttributes", cudaErrorUnknown);
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  *attr = {};
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (allocation* a = find_allocation(p, 1)) {
    attr->device = a->device;
    switch (a->what) {
      case kind::device:
      case kind::pool:
        attr->type = cudaMemoryTypeDevice;
        attr->devicePointer = const_cast<void*>(ptr);
        break;
      case kind::pinned:
        attr->type = cudaMemoryTypeHost;
        attr->devicePointer = attr->hostPointer = const_cast<void*>(ptr);
        break;
      case kind::managed:
        attr->type = cudaMemoryTypeManaged;
        attr->devicePointer = attr->hostPointer = const_cast<void*>(ptr);
        break;
    }
  } else if (vmm_accessible(p, 1)) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeUnregistered;  // CUDA 11+: success, unregistered host memory
  }
  return cudaSuccess;
}

namespace {

/// True when [p, p + n) may be read or written by a copy or memset: a live allocation, VMM
/// memory with access set, or (for a host side) memory the stand-in does not manage.
bool usable(const void* ptr, std::size_t n, bool device_side) {
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (find_allocation(p, n) != nullptr || vmm_accessible(p, n)) return true;
  bool in_reservation = p >= s.base && p < s.base + s.capacity;
  for (auto& [at, r] : s.reservations) in_reservation = in_reservation || (p >= at && p < at + r.bytes);
  return !device_side && !in_reservation;  // freed or unmapped device memory is never usable
}

bool device_side(cudaMemcpyKind kind, bool dst) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return dst;
    case cudaMemcpyDeviceToHost: return !dst;
    case cudaMemcpyDeviceToDevice: return true;
    default: return false;  // host to host, or default (inferred from the pointer)
  }
}

cudaError_t check_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (!usable(dst, n, device_side(kind, true)) || !usable(src, n, device_side(kind, false)))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind) {
  STANDIN_ENTER("cudaMemcpy", cudaErrorUnknown);
  if (cudaError_t e = check_copy(dst, src, n, kind); e != cudaSuccess) return fail(e);
  CUstream_st* legacy = S().legacy;
  block_on(legacy, submit(legacy, [=] { std::memmove(dst, src, n); }));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  STANDIN_ENTER("cudaMemcpyAsync", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = check_copy(dst, src, n, kind); e != cudaSuccess) return fail(e);
  submit(st, [=] { std::memmove(dst, src, n); });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t n) {
  STANDIN_ENTER("cudaMemset", cudaErrorUnknown);
  if (n == 0) return cudaSuccess;
  if (p == nullptr || !usable(p, n, true)) return fail(cudaErrorInvalidValue);
  CUstream_st* legacy = S().legacy;
  block_on(legacy, submit(legacy, [=] { std::memset(p, value, n); }));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  STANDIN_ENTER("cudaMemsetAsync", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (p == nullptr || !usable(p, n, true)) return fail(cudaErrorInvalidValue);
  submit(st, [=] { std::memset(p, value, n); });
  return cudaSuccess;
}

// ---- stream-ordered allocation ------------------------------------------------------------------

/// Runtime API, cudaMemPoolCreate: pinned device allocations on a valid device, no export
/// handle types beyond none.
cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t* pool, const struct cudaMemPoolProps* props) {
  STANDIN_ENTER("cudaMemPoolCreate", cudaErrorMemoryAllocation);
  if (pool == nullptr || props == nullptr || props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
      props->location.id >= S().devices || props->handleTypes != cudaMemHandleTypeNone)
    return fail(cudaErrorInvalidValue);
  auto* p = new CUmemPoolHandle_st;
  p->device = props->location.id;
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.pools.insert(p);
  *pool = p;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t pool) {
  STANDIN_ENTER("cudaMemPoolDestroy", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (s.pools.erase(pool) == 0) return fail(cudaErrorInvalidValue);
  s.destroyed_pools.push_back(pool);  // kept: outstanding allocations still name it (freed with them)
  return cudaSuccess;
}

namespace {
bool live_pool(cudaMemPool_t pool) {
  auto& s = S();
  if (s.pools.count(pool) != 0) return true;
  for (auto* d : s.default_pools)
    if (d == pool) return true;
  return false;
}
}  // namespace

cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void* value) {
  STANDIN_ENTER("cudaMemPoolSetAttribute", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (!live_pool(pool) || value == nullptr) return fail(cudaErrorInvalidValue);
  auto v = *static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: pool->release_threshold = v; return cudaSuccess;
    // Runtime API, cudaMemPoolAttr: the high-water marks may only be reset, to zero.
    case cudaMemPoolAttrReservedMemHigh:
      if (v != 0) return fail(cudaErrorInvalidValue);
      pool->reserved_high = pool->used + pool->kept;
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
      if (v != 0) return fail(cudaErrorInvalidValue);
      pool->used_high = pool->used;
      return cudaSuccess;
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies: return cudaSuccess;  // int flags, accepted
    default: return fail(cudaErrorInvalidValue);  // read-only or unknown
  }
}

cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void* value) {
  STANDIN_ENTER("cudaMemPoolGetAttribute", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (!live_pool(pool) || value == nullptr) return fail(cudaErrorInvalidValue);
  auto* out = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: *out = pool->release_threshold; return cudaSuccess;
    case cudaMemPoolAttrReservedMemCurrent: *out = pool->used + pool->kept; return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh: *out = pool->reserved_high; return cudaSuccess;
    case cudaMemPoolAttrUsedMemCurrent: *out = pool->used; return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh: *out = pool->used_high; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);
  }
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  STANDIN_ENTER("cudaMemPoolTrimTo", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (!live_pool(pool)) return fail(cudaErrorInvalidValue);
  pool->kept = std::min<std::uint64_t>(pool->kept, keep);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void** p, size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  STANDIN_ENTER("cudaMallocFromPoolAsync", cudaErrorMemoryAllocation);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (p == nullptr || !live_pool(pool)) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* q = take_device(bytes);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  std::size_t mapped = (bytes + page - 1) / page * page;
  s.allocations[reinterpret_cast<std::uintptr_t>(q)] = {bytes, mapped, kind::pool, pool->device, pool};
  pool->kept -= std::min<std::uint64_t>(pool->kept, mapped);  // reuses kept bytes first
  pool->used += mapped;
  pool->used_high = std::max(pool->used_high, pool->used);
  pool->reserved_high = std::max(pool->reserved_high, pool->used + pool->kept);
  *p = q;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocFromPoolAsync(p, bytes, S().default_pools.at(static_cast<std::size_t>(current_device)), stream);
}

/// The memory goes back when the stream reaches the free; until then it stays usable by the
/// work enqueued before it, and a second free of it is cudaErrorInvalidValue.
cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t stream) {
  STANDIN_ENTER("cudaFreeAsync", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (p == nullptr) return cudaSuccess;
  auto& s = S();
  {
    std::lock_guard lock(s.mutex);
    auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == s.allocations.end() || it->second.freeing || it->second.what != kind::pool)
      return fail(cudaErrorInvalidValue);
    it->second.freeing = true;
  }
  submit(st, [p] {
    auto& s = S();
    std::lock_guard lock(s.mutex);
    release_allocation(reinterpret_cast<std::uintptr_t>(p));
  });
  return cudaSuccess;
}

// ---- streams and events -------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  STANDIN_ENTER("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation);
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  auto* st = new CUstream_st(flags);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.streams.insert(st);
  *stream = st;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

/// Runtime API, cudaStreamDestroy: returns at once; work already in the stream completes
/// first. The handle is invalid afterwards (the object is kept, so its address is never
/// reused by a later stream).
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  STANDIN_ENTER("cudaStreamDestroy", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread || s.streams.erase(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  s.destroyed_streams.push_back(stream);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  STANDIN_ENTER("cudaStreamSynchronize", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  block_on(st, st->tail());
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  STANDIN_ENTER("cudaStreamQuery", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return st->done() >= st->tail() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  STANDIN_ENTER("cudaStreamIsCapturing", cudaErrorUnknown);
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  if (resolve(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  *status = cudaStreamCaptureStatusNone;  // the stand-in has no graphs
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  STANDIN_ENTER("cudaLaunchHostFunc", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  submit(st, [fn, data] {
    in_host_function = true;
    fn(data);
    in_host_function = false;
  });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  STANDIN_ENTER("cudaEventCreateWithFlags", cudaErrorMemoryAllocation);
  constexpr unsigned int known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  // Runtime API, cudaEventCreateWithFlags: an interprocess event must also disable timing.
  if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

namespace {
bool live_event(cudaEvent_t e) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (s.events.count(e) != 0) return true;
  if (std::find(s.destroyed_events.begin(), s.destroyed_events.end(), e) != s.destroyed_events.end())
    destroyed_handle("event", e);
  return false;
}
/// Where the event was last recorded: its stream (nullptr: never) and ticket.
std::pair<CUstream_st*, std::uint64_t> position(cudaEvent_t e) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  return {e->stream, e->ticket};
}
}  // namespace

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  STANDIN_ENTER("cudaEventDestroy", cudaErrorUnknown);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (s.events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  s.destroyed_events.push_back(event);  // kept, so a later event never reuses the address
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  STANDIN_ENTER("cudaEventRecord", cudaErrorUnknown);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::uint64_t ticket = submit(st, [] {});  // a marker task: complete when the work before it is
  auto& s = S();
  std::lock_guard lock(s.mutex);
  event->stream = st;
  event->ticket = ticket;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  STANDIN_ENTER("cudaEventQuery", cudaErrorUnknown);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  auto [on, ticket] = position(event);
  if (on == nullptr) return cudaSuccess;
  return on->done() >= ticket ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  STANDIN_ENTER("cudaEventSynchronize", cudaErrorUnknown);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (auto [on, ticket] = position(event); on != nullptr) {
    block_on(on, ticket);
  } else {
    ++S().blocking;  // a blocking call even when there is nothing to wait for
  }
  return cudaSuccess;
}

/// The stream waits for the event's work as recorded now; a later record of the event or
/// its destruction does not change what this wait waits for (runtime API, cudaStreamWaitEvent).
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  STANDIN_ENTER("cudaStreamWaitEvent", cudaErrorUnknown);
  CUstream_st* st = resolve(stream);
  if (st == nullptr || !live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventWaitDefault && flags != cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
  auto [on, ticket] = position(event);
  if (on == nullptr) return cudaSuccess;
  submit(st, [on, ticket] { on->wait_for(ticket); });
  return cudaSuccess;
}

}  // extern "C"

// ---- the driver's VMM entry points --------------------------------------------------------------

namespace {

#define STANDIN_CU_ENTER(name, exhausted)                       \
  do {                                                          \
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;      \
    if (enter(name)) return exhausted;                          \
  } while (0)

bool valid_prop(const CUmemAllocationProp* prop) {
  return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         prop->location.id >= 0 && prop->location.id < S().devices;
}

CUresult standin_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags) {
  STANDIN_CU_ENTER("cuMemGetAllocationGranularity", CUDA_ERROR_UNKNOWN);
  if (granularity == nullptr || !valid_prop(prop)) return CUDA_ERROR_INVALID_VALUE;
  *granularity = vmm_granularity;
  return CUDA_SUCCESS;
}

/// Driver API, cuMemAddressReserve: size a multiple of the granularity; the alignment a power
/// of two (0: the granularity); a fixed address is not supported by the stand-in.
CUresult standin_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  STANDIN_CU_ENTER("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY);
  if (ptr == nullptr || size == 0 || size % vmm_granularity != 0 || addr != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::size_t align = std::max<std::size_t>(alignment, vmm_granularity);
  void* p = mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto raw = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t at = (raw + align - 1) / align * align;
  if (at > raw) munmap(p, at - raw);
  if (raw + size + align > at + size) munmap(reinterpret_cast<void*>(at + size), raw + size + align - (at + size));
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.reservations[at] = reservation{size, {}, {}};
  *ptr = at;
  return CUDA_SUCCESS;
}

/// Driver API, cuMemAddressFree: the whole reservation, with nothing mapped in it.
CUresult standin_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  STANDIN_CU_ENTER("cuMemAddressFree", CUDA_ERROR_UNKNOWN);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second.bytes != size || !it->second.mappings.empty())
    return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

/// Driver API, cuMemCreate: size a multiple of the granularity; device memory counted
/// against the capacity (out of memory when it would exceed it).
CUresult standin_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  STANDIN_CU_ENTER("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  if (handle == nullptr || size == 0 || size % vmm_granularity != 0 || flags != 0 || !valid_prop(prop))
    return CUDA_ERROR_INVALID_VALUE;
  auto& s = S();
  std::lock_guard lock(s.mutex);
  if (s.used + size > s.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
  s.used += size;
  *handle = s.next_handle++;
  s.handles[*handle] = vmm_handle{size, prop->location.id};
  return CUDA_SUCCESS;
}

/// Driver API, cuMemRelease: the memory goes back once the handle is released and unmapped;
/// the stand-in refuses to release a handle that is still mapped, so a release before unmap
/// shows as an error rather than as deferred freeing.
CUresult standin_cuMemRelease(CUmemGenericAllocationHandle handle) {
  STANDIN_CU_ENTER("cuMemRelease", CUDA_ERROR_UNKNOWN);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.mapped_at != 0) return CUDA_ERROR_INVALID_VALUE;
  s.used -= it->second.bytes;
  s.handles.erase(it);
  return CUDA_SUCCESS;
}

/// Driver API, cuMemMap: inside one reservation, granule-aligned, over no mapped range, the
/// whole handle at offset 0 (the stand-in maps each handle once). The memory is not usable
/// until cuMemSetAccess.
CUresult standin_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  STANDIN_CU_ENTER("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || flags != 0 || offset != 0 || size != h->second.bytes || h->second.mapped_at != 0 ||
      ptr % vmm_granularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr + size > r->first + r->second.bytes) return CUDA_ERROR_INVALID_VALUE;
  for (CUdeviceptr a = ptr; a < ptr + size; a += vmm_granularity)
    for (auto& [at, hh] : r->second.mappings)
      if (a >= at && a < at + s.handles[hh].bytes) return CUDA_ERROR_INVALID_VALUE;
  r->second.mappings[ptr] = handle;
  h->second.mapped_at = ptr;
  return CUDA_SUCCESS;
}

/// Driver API, cuMemUnmap: exactly whole mappings.
CUresult standin_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  STANDIN_CU_ENTER("cuMemUnmap", CUDA_ERROR_UNKNOWN);
  auto& s = S();
  std::lock_guard lock(s.mutex);
  for (auto& [at, r] : s.reservations) {
    if (ptr < at || ptr >= at + r.bytes) continue;
    std::size_t covered = 0;
    for (CUdeviceptr a = ptr; a < ptr + size; a += covered) {
      auto m = r.mappings.find(a);
      if (m == r.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
      covered = s.handles[m->second].bytes;
    }
    for (CUdeviceptr a = ptr; a < ptr + size;) {
      auto m = r.mappings.find(a);
      std::size_t n = s.handles[m->second].bytes;
      s.handles[m->second].mapped_at = 0;
      for (CUdeviceptr g = a; g < a + n; g += vmm_granularity) r.accessible.erase(g);
      madvise(reinterpret_cast<void*>(a), n, MADV_DONTNEED);
      mprotect(reinterpret_cast<void*>(a), n, PROT_NONE);
      r.mappings.erase(m);
      a += n;
    }
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

/// Driver API, cuMemSetAccess: every granule of the range mapped; read-write for a valid
/// device.
CUresult standin_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  STANDIN_CU_ENTER("cuMemSetAccess", CUDA_ERROR_UNKNOWN);
  if (desc == nullptr || count == 0 || size == 0 || size % vmm_granularity != 0 || ptr % vmm_granularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i)
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= S().devices)
      return CUDA_ERROR_INVALID_DEVICE;
  auto& s = S();
  std::lock_guard lock(s.mutex);
  for (auto& [at, r] : s.reservations) {
    if (ptr < at || ptr >= at + r.bytes) continue;
    for (CUdeviceptr a = ptr; a < ptr + size; a += vmm_granularity) {
      bool mapped = false;
      for (auto& [m, hh] : r.mappings) mapped = mapped || (a >= m && a < m + s.handles[hh].bytes);
      if (!mapped) return CUDA_ERROR_INVALID_VALUE;
    }
    bool write = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    mprotect(reinterpret_cast<void*>(ptr), size, write ? PROT_READ | PROT_WRITE : PROT_READ);
    for (CUdeviceptr a = ptr; a < ptr + size; a += vmm_granularity) r.accessible.insert(a);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                                  unsigned long long flags,
                                                                  enum cudaDriverEntryPointQueryResult* status) {
  STANDIN_ENTER("cudaGetDriverEntryPointByVersion", cudaErrorUnknown);
  if (symbol == nullptr || fn == nullptr || version < 11030 ||
      (flags != cudaEnableDefault && flags != cudaEnableLegacyStream && flags != cudaEnablePerThreadDefaultStream))
    return fail(cudaErrorInvalidValue);
  static const std::map<std::string, void*> table = {
      {"cuMemAddressReserve", reinterpret_cast<void*>(&standin_cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&standin_cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&standin_cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&standin_cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&standin_cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&standin_cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&standin_cuMemSetAccess)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&standin_cuMemGetAllocationGranularity)},
  };
  auto it = table.find(symbol);
  *fn = it != table.end() ? it->second : nullptr;
  if (status != nullptr) *status = it != table.end() ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// ---- the control API (standin.h) ----------------------------------------------------------------

extern "C" {

size_t vram_standin_calls(const char* name) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.calls.find(name);
  return it == s.calls.end() ? 0 : it->second;
}

size_t vram_standin_blocking_calls(void) { return S().blocking.load(); }

void vram_standin_reset_counts(void) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.calls.clear();
  s.blocking = 0;
}

void vram_standin_fail_call(const char* name, size_t nth) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  s.fail_name = name != nullptr ? name : "";
  s.fail_countdown = nth;
}

size_t vram_standin_leaks(int report) {
  auto& s = S();
  std::lock_guard lock(s.mutex);
  std::size_t by_kind[4] = {};
  for (auto& [at, a] : s.allocations) ++by_kind[static_cast<int>(a.what)];
  std::size_t mapped = 0;
  for (auto& [at, r] : s.reservations) mapped += r.mappings.size();
  const std::pair<const char*, std::size_t> rows[] = {
      {"device allocations (cudaMalloc)", by_kind[0]},
      {"pool allocations (cudaMallocAsync / FromPoolAsync)", by_kind[1]},
      {"pinned host allocations (cudaHostAlloc)", by_kind[2]},
      {"managed allocations (cudaMallocManaged)", by_kind[3]},
      {"VMM handles (cuMemCreate)", s.handles.size()},
      {"VMM mappings (cuMemMap)", mapped},
      {"VMM reservations (cuMemAddressReserve)", s.reservations.size()},
      {"streams (cudaStreamCreate)", s.streams.size()},
      {"events (cudaEventCreate)", s.events.size()},
      {"memory pools (cudaMemPoolCreate)", s.pools.size()},
  };
  std::size_t total = 0;
  for (auto [what, n] : rows) {
    total += n;
    if (report != 0 && n != 0) std::fprintf(stderr, "cuda stand-in: %zu %s still held\n", n, what);
  }
  return total;
}

}  // extern "C"
