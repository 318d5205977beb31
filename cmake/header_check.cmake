# Compiles every header under include/vram on its own: one generated translation unit per
# header, with the C++ compiler and, where CUDA is found, with nvcc. Target: vram_header_check.
file(GLOB_RECURSE vram_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
     ${PROJECT_SOURCE_DIR}/include/vram/*.hpp)
set(check_dir ${PROJECT_BINARY_DIR}/header_check)
set(cxx_units)
set(cuda_units)
foreach(header IN LISTS vram_headers)
  string(MAKE_C_IDENTIFIER ${header} id)
  set(body "#include <${header}>\n#include <${header}>  // and include guards work\nint ${id}_compiles = 0;\n")
  file(CONFIGURE OUTPUT ${check_dir}/${id}.cpp CONTENT "${body}")
  list(APPEND cxx_units ${check_dir}/${id}.cpp)
  if(VRAM_HAS_CUDA)
    file(CONFIGURE OUTPUT ${check_dir}/${id}.cu CONTENT "${body}")
    list(APPEND cuda_units ${check_dir}/${id}.cu)
  endif()
endforeach()
add_library(vram_header_check OBJECT ${cxx_units} ${cuda_units})
target_link_libraries(vram_header_check PRIVATE vram::vram)
target_compile_options(vram_header_check PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
# One device architecture is enough to prove a header compiles under nvcc (and halves the time).
set_target_properties(vram_header_check PROPERTIES CUDA_ARCHITECTURES 90)
