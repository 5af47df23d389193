# FindCUDNN: NVIDIA cuDNN (9 or newer: the legacy convolution API in cudnn_cnn.h).
#
# Looks in CUDNN_ROOT (CMake or environment variable) first, then the CUDA toolkit's folders, then the system's.
# Result: CUDNN_FOUND, CUDNN_VERSION (from cudnn_version.h), CUDNN_INCLUDE_DIR, CUDNN_LIBRARY and the imported target
# CUDNN::CUDNN.
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
  ${CUDAToolkit_LIBRARY_ROOT}/lib64)
if(CUDNN_INCLUDE_DIR AND EXISTS ${CUDNN_INCLUDE_DIR}/cudnn_version.h)
  file(STRINGS ${CUDNN_INCLUDE_DIR}/cudnn_version.h version_lines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(part MAJOR MINOR PATCHLEVEL)
    string(REGEX REPLACE ".*#define CUDNN_${part} +([0-9]+).*" "\\1" CUDNN_VERSION_${part} "${version_lines}")
  endforeach()
  set(CUDNN_VERSION ${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCHLEVEL})
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
