#pragma once
// The umbrella header: everything in vram that compiles without CUDA, plus the CUDA sources
// when VRAM_HAS_CUDA. Prefer the individual headers in your own code.

#include <vram/version.hpp>

// core/
#include <vram/core/alignment.hpp>
#include <vram/core/any_resource.hpp>
#include <vram/core/bytes.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/observers.hpp>
#include <vram/core/parse.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/ref.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/core/tenant_id.hpp>

// source/ (the CUDA ones refuse to compile where VRAM_HAS_CUDA is not set)
#include <vram/core/config.hpp>
#if VRAM_HAS_CUDA
#  include <vram/source/cuda_async_source.hpp>
#  include <vram/source/cuda_device_source.hpp>
#  include <vram/source/cuda_managed_source.hpp>
#  include <vram/source/cuda_pinned_source.hpp>
#  include <vram/source/cuda_vmm_source.hpp>
#endif
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

// alloc/
#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>

// adaptor/
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/adaptor/logging_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/quota_ledger.hpp>
#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/statistics_observer.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/adaptor/tracker_observer.hpp>
#include <vram/adaptor/tracker_snapshot.hpp>

// trace/ (read_trace.hpp reads .json.gz with -DVRAM_WITH_ZLIB=1 and ZLIB::ZLIB linked)
#include <vram/trace/read_trace.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/report.hpp>
#include <vram/trace/trace.hpp>
#include <vram/trace/workloads.hpp>

// interop/ -- not <vram/interop/cuda_mr.hpp>: it must come before any CCCL header (it
// enables CCCL's experimental memory resources), so include it yourself, first. The C ABI
// is the library vram::vram_c with the header <vram/vram_c.h>.
#include <vram/interop/device_registry.hpp>
#include <vram/interop/pmr.hpp>
#include <vram/interop/thrust.hpp>
