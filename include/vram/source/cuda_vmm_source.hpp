#pragma once
// vram::cuda_vmm_source: one reserved, growable range of device memory built with the CUDA
// virtual memory management calls (what PyTorch calls expandable segments).

#include <vram/source/detail/cuda_only.hpp>  // first: stops a build without CUDA with a message

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>

#if VRAM_HAS_CUDA
#include <cuda.h>  // driver API types only: the functions are fetched at run time (no libcuda link)

namespace vram {

struct cuda_vmm_options {
  /// Bytes of virtual address space to reserve (the most this source can ever map).
  /// 0: the device's total memory.
  std::size_t capacity = 0;
  /// The device; -1: the device current at construction.
  int device = -1;
};

namespace detail {

/// The driver entry points cuda_vmm_source uses, fetched once through the runtime
/// (cudaGetDriverEntryPointByVersion), so programs link only cudart.
struct vmm_driver {
  CUresult (*mem_address_reserve)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle*, std::size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) = nullptr;
  CUresult (*mem_get_allocation_granularity)(std::size_t*, const CUmemAllocationProp*,
                                             CUmemAllocationGranularity_flags) = nullptr;

  static const vmm_driver& get() {
    static const vmm_driver driver = load();
    return driver;
  }

 private:
  template <class F>
  static void fetch(F& f, const char* symbol) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    check_cuda(cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion");
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw_cuda_error(static_cast<int>(cudaErrorSymbolNotFound), symbol);
    f = reinterpret_cast<F>(p);
  }
  static vmm_driver load() {
    vmm_driver d;
    fetch(d.mem_address_reserve, "cuMemAddressReserve");
    fetch(d.mem_address_free, "cuMemAddressFree");
    fetch(d.mem_create, "cuMemCreate");
    fetch(d.mem_release, "cuMemRelease");
    fetch(d.mem_map, "cuMemMap");
    fetch(d.mem_unmap, "cuMemUnmap");
    fetch(d.mem_set_access, "cuMemSetAccess");
    fetch(d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
    return d;
  }
};

/// Throws cuda_error (code: the CUresult) unless `r` is CUDA_SUCCESS.
inline void check_cu(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) [[unlikely]]
    throw_cuda_error(static_cast<int>(r), call);
}

}  // namespace detail

/// Device memory from one reserved virtual range, mapped granule by granule.
///
/// Purpose: the upstream under which stream_pool grows in place. The constructor reserves
/// `capacity` bytes of address space (cuMemAddressReserve); allocate maps physical memory
/// (cuMemCreate, one handle per granule, cuMemMap, cuMemSetAccess for the device) at the
/// lowest free addresses of the range, so successive allocations are adjacent and a pool may
/// merge them (contiguous() is true). Any granularity-aligned piece of mapped memory may be
/// deallocated on its own (its granules are unmapped and released), which is how a pool
/// trims free memory in the middle of its range.
///
/// Thread safety: all members may be called concurrently (one mutex: it is an upstream).
/// Streams: mapped memory is usable on every stream at once; deallocate(s, ...) synchronizes
/// `s` before unmapping (unmapping memory a kernel still uses would fault).
/// Alignment: allocations are aligned to granularity() (2 MiB on current GPUs); a larger
/// alignment is an invalid argument. Sizes are rounded up to the granularity.
/// Errors: out_of_memory when the range is full or cuMemCreate runs out of device memory
/// (everything mapped by the failing call is undone); cuda_error (code: the CUresult) for any
/// other driver failure. Freeing memory that is not mapped is reported as a foreign pointer.
/// Copies share the range and compare equal; the range is unmapped and freed with the last.
/// Complexity: allocate O(r + g), r free ranges of the reservation (first fit from the lowest
/// address: a pool above it merges what it frees, so r stays small), g granules mapped;
/// deallocate O(log r + g).
class cuda_vmm_source {
 public:
  explicit cuda_vmm_source(cuda_vmm_options options = {}) : state_(std::make_shared<state>(options)) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "cuda_vmm_source"; }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > state_->granularity) detail::throw_invalid_argument(name(), "alignment above the VMM granularity");
    if (bytes == 0) return nullptr;
    return state_->map(bytes);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p != nullptr) state_->unmap(p, bytes);
  }
  void* allocate(stream_ref, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate_sync(bytes, align);
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    try {
      synchronize(s);
    } catch (...) {
      report_misuse({misuse::upstream_failure, name(), p, bytes, 0});
    }
    deallocate_sync(p, bytes, align);
  }

  [[nodiscard]] static constexpr bool contiguous() noexcept { return true; }
  [[nodiscard]] std::size_t granularity() const noexcept { return state_->granularity; }
  [[nodiscard]] std::size_t capacity() const noexcept { return state_->capacity; }
  [[nodiscard]] int device() const noexcept { return state_->device; }
  /// Bytes currently mapped.
  [[nodiscard]] std::size_t mapped_bytes() const {
    std::lock_guard lock(state_->mutex);
    return state_->mapped;
  }

  friend bool operator==(const cuda_vmm_source& a, const cuda_vmm_source& b) noexcept { return a.state_ == b.state_; }
  friend constexpr void get_property(const cuda_vmm_source&, device_accessible) noexcept {}

 private:
  struct state {
    explicit state(const cuda_vmm_options& o) : driver(detail::vmm_driver::get()) {
      device = o.device;
      if (device < 0) detail::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = device;
      detail::check_cu(driver.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                       "cuMemGetAllocationGranularity");
      if (!is_power_of_two(granularity) || granularity < default_alignment)
        detail::throw_invalid_argument(name(), "unexpected VMM granularity");
      capacity = o.capacity;
      if (capacity == 0) {
        std::size_t free_bytes = 0, total = 0;
        int previous = 0;
        detail::check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
        detail::check_cuda(cudaSetDevice(device), "cudaSetDevice");
        cudaError_t status = cudaMemGetInfo(&free_bytes, &total);
        (void)cudaSetDevice(previous);
        detail::check_cuda(status, "cudaMemGetInfo");
        capacity = total;
      }
      capacity = align_up(capacity, granularity);
      if (capacity > max_request_bytes) detail::throw_invalid_argument(name(), "absurd capacity");
      detail::check_cu(driver.mem_address_reserve(&base, capacity, granularity, 0, 0), "cuMemAddressReserve");
      handles.assign(capacity / granularity, 0);
      free.emplace(0, capacity);
    }

    ~state() {
      for (std::size_t g = 0; g < handles.size(); ++g)
        if (handles[g] != 0) unmap_granule(g);
      if (driver.mem_address_free(base, capacity) != CUDA_SUCCESS)
        report_misuse({misuse::upstream_failure, name(), reinterpret_cast<void*>(base), capacity, 0});
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;

    void* map(std::size_t bytes) {
      std::size_t rounded = align_up(bytes, granularity);
      std::lock_guard lock(mutex);
      auto it = free.begin();  // lowest address first: growth lands next to what is mapped
      while (it != free.end() && it->second < rounded) ++it;
      if (it == free.end()) detail::throw_out_of_memory(name(), bytes, stream_ref{});
      std::size_t offset = it->first;
      std::size_t first = offset / granularity, count = rounded / granularity;
      std::size_t done = 0;
      try {
        for (; done < count; ++done) {
          CUmemGenericAllocationHandle h = 0;
          CUresult r = driver.mem_create(&h, granularity, &prop, 0);
          if (r == CUDA_ERROR_OUT_OF_MEMORY) detail::throw_out_of_memory(name(), bytes, stream_ref{});
          detail::check_cu(r, "cuMemCreate");
          r = driver.mem_map(base + (first + done) * granularity, granularity, 0, h, 0);
          if (r != CUDA_SUCCESS) {
            (void)driver.mem_release(h);  // undo the create; the map error is what we report
            detail::check_cu(r, "cuMemMap");
          }
          handles[first + done] = h;
        }
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        detail::check_cu(driver.mem_set_access(base + offset, rounded, &access, 1), "cuMemSetAccess");
      } catch (...) {
        for (std::size_t g = first; g < first + done; ++g) unmap_granule(g);
        throw;
      }
      std::size_t left = it->second - rounded;
      free.erase(it);
      if (left != 0) free.emplace(offset + rounded, left);
      mapped += rounded;
      return reinterpret_cast<void*>(base + offset);
    }

    void unmap(void* p, std::size_t bytes) noexcept {
      auto addr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
      std::size_t rounded = align_up(bytes, granularity);
      std::lock_guard lock(mutex);
      bool ok = addr >= base && addr - base + rounded <= capacity && is_aligned(addr - base, granularity);
      std::size_t first = ok ? (addr - base) / granularity : 0, count = rounded / granularity;
      for (std::size_t g = first; ok && g < first + count; ++g) ok = handles[g] != 0;
      if (!ok) {
        report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
        return;
      }
      for (std::size_t g = first; g < first + count; ++g) unmap_granule(g);
      mapped -= rounded;
      add_free(addr - base, rounded);
    }

    void unmap_granule(std::size_t g) noexcept {
      CUdeviceptr at = base + g * granularity;
      if (driver.mem_unmap(at, granularity) != CUDA_SUCCESS || driver.mem_release(handles[g]) != CUDA_SUCCESS)
        report_misuse({misuse::upstream_failure, name(), reinterpret_cast<void*>(at), granularity, 0});
      handles[g] = 0;
    }

    /// Inserts a free range of offsets, merging with free neighbours.
    void add_free(std::size_t offset, std::size_t bytes) {
      auto next = free.lower_bound(offset);
      if (next != free.end() && offset + bytes == next->first) {
        bytes += next->second;
        next = free.erase(next);
      }
      if (next != free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += bytes;
          return;
        }
      }
      free.emplace_hint(next, offset, bytes);
    }

    const detail::vmm_driver& driver;
    int device = 0;
    CUmemAllocationProp prop{};
    std::size_t granularity = 0;
    std::size_t capacity = 0;
    CUdeviceptr base = 0;

    mutable std::mutex mutex;
    std::map<std::size_t, std::size_t> free;          // offset -> bytes; sum == capacity - mapped
    std::vector<CUmemGenericAllocationHandle> handles;  // per granule; 0: not mapped
    std::size_t mapped = 0;
  };

  std::shared_ptr<state> state_;
};

static_assert(resource_with<cuda_vmm_source, device_accessible>);
static_assert(has_contiguous_growth<cuda_vmm_source>);

}  // namespace vram
#endif
