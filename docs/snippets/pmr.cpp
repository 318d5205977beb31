// docs/integration.md: std::pmr containers over a pool.
// [snippet]
#include <memory_resource>
#include <string>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/interop/pmr.hpp>
#include <vram/source/host_source.hpp>

int main() {
  vram::stream_pool<vram::host_source> pool;
  vram::pmr_resource mr{pool};            // pmr_resource<vram::ref_t<stream_pool<host_source>>>
  std::pmr::vector<int> v(&mr);
  std::pmr::string s("a string too long for the small-string buffer", &mr);
  v.push_back(1);
}
// [/snippet]
