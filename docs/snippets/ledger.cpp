// docs/quotas.md: a process charging a quota ledger shared with other processes.
#include <cstddef>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/ref.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::stream_ref stream, std::size_t bytes) {
  // [snippet]
  auto ledger = vram::quota_ledger::attach("vram-gpu0");            // claims a process slot
  vram::ledger_quota_adaptor<vram::cuda_device_source> charged(
      vram::cuda_device_source{0}, {ledger, ledger->at("serving/llama")});
  vram::stream_pool pool(vram::ref(charged));                        // the pool's growth is charged
  void* p = pool.allocate(stream, bytes);  // out_of_memory once serving/llama (or serving) is full
  pool.deallocate(stream, p, bytes);
  // [/snippet]
}
