# The CUDA backend as a module (libhpctrain_cuda.so) that the hpctrain executable opens at run time (dlopen) when
# run.device is cuda or auto: the executable itself links no CUDA library, so it starts on CPU nodes without them and
# a CPU run costs what a CPU-only build's does (docs/design.md, "CUDA backend").
#
# Sets HPCTRAIN_HAVE_CUDA (the module is built), HPCTRAIN_HAVE_NCCL, HPCTRAIN_HAVE_CUDNN, and for hpctrain_lib the
# module's place relative to the executable (build tree and install tree alike: bin/../lib).
set(HPCTRAIN_HAVE_NCCL OFF)
set(HPCTRAIN_HAVE_CUDNN OFF)
set(HPCTRAIN_CUDA_MODULE_NAME libhpctrain_cuda.so)
file(RELATIVE_PATH HPCTRAIN_CUDA_MODULE_RELATIVE_DIR ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/kernels/cuda_module.cpp APPEND PROPERTY COMPILE_DEFINITIONS
  HPCTRAIN_CUDA_MODULE_BUILT=$<BOOL:${HPCTRAIN_HAVE_CUDA}>
  HPCTRAIN_CUDA_MODULE_RELATIVE_PATH="${HPCTRAIN_CUDA_MODULE_RELATIVE_DIR}/${HPCTRAIN_CUDA_MODULE_NAME}")
if(NOT HPCTRAIN_HAVE_CUDA)
  return()
endif()

file(GLOB HPCTRAIN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*/cuda/*.cu
  ${PROJECT_SOURCE_DIR}/src/*/cuda/*.cpp)
# cuDNN (convolutions): without it the CUDA backend has no convolutions, and decks with spatial layers are refused on
# it at set-up. HPCTRAIN_CUDNN=OFF builds without it even when found.
if(HPCTRAIN_CUDNN)
  find_package(CUDNN)
endif()
if(HPCTRAIN_CUDNN AND CUDNN_FOUND)
  set(HPCTRAIN_HAVE_CUDNN ON)
else()
  list(FILTER HPCTRAIN_CUDA_SOURCES EXCLUDE REGEX "/cuda_convolution\\.cu$")
  message(WARNING "cuDNN not used (not found: set CUDNN_ROOT; or HPCTRAIN_CUDNN=OFF): the CUDA backend will "
    "refuse convolutional networks")
endif()

add_library(hpctrain_cuda MODULE ${HPCTRAIN_CUDA_SOURCES})
set_target_properties(hpctrain_cuda PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin/${HPCTRAIN_CUDA_MODULE_RELATIVE_DIR}
  # Only the entry point is exported: the module's own definitions (make_cuda_backend, ...) bind inside it and never
  # to the executable's same-named forwarders. What it needs from the executable stays undefined until dlopen.
  CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
target_link_libraries(hpctrain_cuda PRIVATE hpctrain_headers hpctrain_flags CUDA::cudart CUDA::cublasLt)
target_compile_definitions(hpctrain_cuda PRIVATE HPCTRAIN_HAVE_CUDA=1)
# Device code: fp32 math as written (no fast-math), relocatable code not needed (no cross-file device calls).
target_compile_options(hpctrain_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
if(HPCTRAIN_HAVE_CUDNN)
  target_link_libraries(hpctrain_cuda PRIVATE CUDNN::CUDNN)
  target_compile_definitions(hpctrain_cuda PRIVATE HPCTRAIN_HAVE_CUDNN=1)
endif()
add_dependencies(hpctrain hpctrain_cuda)  # building hpctrain builds what it loads

# NCCL (gradient all-reduce between GPUs): without it one rank still runs; several are refused.
find_package(NCCL)
if(NCCL_FOUND)
  set(HPCTRAIN_HAVE_NCCL ON)
  target_link_libraries(hpctrain_cuda PRIVATE NCCL::NCCL)
  target_compile_definitions(hpctrain_cuda PRIVATE HPCTRAIN_HAVE_NCCL=1)
else()
  message(WARNING "NCCL not found (set NCCL_ROOT): multi-rank CUDA runs will be refused")
endif()

install(TARGETS hpctrain_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
