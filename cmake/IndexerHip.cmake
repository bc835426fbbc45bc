# The HIP side of the build (GPU=HIP, or AUTO where HIP links).
#
# HIP sources are compiled as C++ by the project's clang (CXX=clang++-19 on
# Debian 12, ROCm's clang in a ROCm image) with `-x hip`, not through CMake's
# HIP language: CMake 3.25 looks for hip-lang-config.cmake under
# <rocm>/lib/cmake only, and Debian installs it under lib/<multiarch>/cmake.
#
# Two modes, chosen by a probe at configure time:
# - link: the device libraries (ocml, ockl, oclc_isa_version_<N>.bc) serve
#   every architecture: a normal build, every target linked.
# - compile-only: they do not (Debian 12's rocm-device-libs 5.2.3 has
#   oclc_isa_version_940.bc but no _942). Every translation unit is still
#   compiled, host and device: the host pass (--cuda-host-only) in its
#   target, the device pass (--cuda-device-only -nogpulib -S, to ISA
#   assembly) in the target hip_device_check. The host objects hold no code
#   object, so nothing that uses the gpu backend links (undefined
#   __hip_fatbin_): build the objects, not the executables (deploy/test.sh
#   --stage hip). INDEXER_HIP_LINK_REASON says why, as the compiler said it.
#
# Sets INDEXER_HIP_FOUND, INDEXER_HIP_LINK, INDEXER_HIP_LINK_REASON,
# INDEXER_HIP_ARCHS (HIP_ARCH less what the compiler does not know) and the
# target indexer::hip_runtime (headers, __HIP_PLATFORM_AMD__, libamdhip64).

function(indexer_find_hip)
  set(INDEXER_HIP_FOUND OFF PARENT_SCOPE)
  set(INDEXER_HIP_LINK OFF PARENT_SCOPE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(STATUS "HIP: needs clang as the C++ compiler (CXX=clang++-19), have "
                   "${CMAKE_CXX_COMPILER_ID}")
    return()
  endif()
  find_path(INDEXER_HIP_INCLUDE_DIR hip/hip_runtime.h
            HINTS $ENV{ROCM_PATH} /opt/rocm PATH_SUFFIXES include)
  find_library(INDEXER_HIP_LIBRARY amdhip64
               HINTS $ENV{ROCM_PATH} /opt/rocm PATH_SUFFIXES lib lib64)
  if(NOT INDEXER_HIP_INCLUDE_DIR OR NOT INDEXER_HIP_LIBRARY)
    message(STATUS "HIP: hip/hip_runtime.h or libamdhip64 not found "
                   "(apt-get install libamdhip64-dev)")
    return()
  endif()
  find_path(INDEXER_HIP_DEVICE_LIB_PATH ocml.bc
            HINTS $ENV{ROCM_PATH}/amdgcn/bitcode /opt/rocm/amdgcn/bitcode
                  /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode
                  /usr/lib/amdgcn/bitcode
            NO_DEFAULT_PATH)

  # Architectures the compiler knows (gfx950 needs LLVM 20 or newer).
  set(archs)
  foreach(arch IN LISTS HIP_ARCH)
    execute_process(
      COMMAND ${CMAKE_CXX_COMPILER} -x hip --offload-arch=${arch} --cuda-device-only
              -nogpulib -S -o /dev/null /dev/null
      RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
    if(rc EQUAL 0)
      list(APPEND archs ${arch})
    else()
      string(REGEX REPLACE "\n.*" "" err "${err}")
      message(STATUS "HIP: ${arch} skipped: ${CMAKE_CXX_COMPILER} "
                     "${CMAKE_CXX_COMPILER_VERSION} does not know it (${err})")
    endif()
  endforeach()
  if(NOT archs)
    message(STATUS "HIP: the compiler knows none of HIP_ARCH=${HIP_ARCH}")
    return()
  endif()

  set(offload)
  foreach(arch IN LISTS archs)
    list(APPEND offload --offload-arch=${arch})
  endforeach()
  if(INDEXER_HIP_DEVICE_LIB_PATH)
    list(APPEND offload --rocm-device-lib-path=${INDEXER_HIP_DEVICE_LIB_PATH})
  endif()

  # Link probe: one kernel compiled and device-linked for every architecture
  # (non-rdc HIP links the code object with the device libraries per TU).
  set(probe ${CMAKE_BINARY_DIR}/CMakeFiles/indexer_hip_probe.hip)
  file(WRITE ${probe} "#include <hip/hip_runtime.h>\n"
       "__global__ void Probe(float* x) { x[threadIdx.x] = sqrtf(x[blockIdx.x]); }\n")
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} -x hip ${offload} -c ${probe} -o ${probe}.o
    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0)
    set(link ON)
    set(reason "")
  else()
    set(link OFF)
    string(REGEX MATCH "error: [^\n]*" reason "${err}")
    if(NOT reason)
      set(reason "the probe failed (${rc})")
    endif()
  endif()

  if(NOT TARGET indexer::hip_runtime)
    add_library(indexer::hip_runtime INTERFACE IMPORTED GLOBAL)
    set_target_properties(indexer::hip_runtime PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${INDEXER_HIP_INCLUDE_DIR}"
      INTERFACE_COMPILE_DEFINITIONS "__HIP_PLATFORM_AMD__=1"
      INTERFACE_LINK_LIBRARIES "${INDEXER_HIP_LIBRARY}")
  endif()
  set(INDEXER_HIP_FOUND ON PARENT_SCOPE)
  set(INDEXER_HIP_LINK ${link} PARENT_SCOPE)
  set(INDEXER_HIP_LINK_REASON "${reason}" PARENT_SCOPE)
  set(INDEXER_HIP_ARCHS "${archs}" PARENT_SCOPE)
  set(INDEXER_HIP_OFFLOAD_FLAGS "${offload}" PARENT_SCOPE)
endfunction()

# Marks sources that hold device code (kernels, launches): CUDA compiles
# .cu files as CUDA already; HIP compiles them as C++ with `-x hip`. Call it
# in the directory whose target lists the sources.
function(indexer_gpu_sources)
  if(NOT INDEXER_GPU_BACKEND STREQUAL "HIP")
    return()
  endif()
  set(flags -x hip ${INDEXER_HIP_OFFLOAD_FLAGS})
  if(NOT INDEXER_HIP_LINK)
    list(APPEND flags --cuda-host-only)
  endif()
  foreach(src IN LISTS ARGN)
    set_source_files_properties(${src} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "${flags}")
    get_filename_component(abs ${src} ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY INDEXER_GPU_DEVICE_SOURCES ${abs})
  endforeach()
endfunction()

# Compile-only mode: the device pass of every source indexer_gpu_sources
# marked, per architecture, to ISA assembly under hip_device/<arch>/ (part of
# `all`). -nogpulib: the calls into the device libraries stay unresolved,
# which assembly output allows and a code object would not.
function(indexer_hip_device_check)
  if(NOT INDEXER_GPU_BACKEND STREQUAL "HIP" OR INDEXER_HIP_LINK)
    return()
  endif()
  get_property(sources GLOBAL PROPERTY INDEXER_GPU_DEVICE_SOURCES)
  set(extra_inc)
  if(NOT INDEXER_HIP_INCLUDE_DIR STREQUAL "/usr/include")
    set(extra_inc -I${INDEXER_HIP_INCLUDE_DIR})
  endif()
  set(outs)
  foreach(arch IN LISTS INDEXER_HIP_ARCHS)
    foreach(src IN LISTS sources)
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
      string(REPLACE "/" "__" name ${rel})
      set(out ${CMAKE_BINARY_DIR}/hip_device/${arch}/${name}.s)
      add_custom_command(
        OUTPUT ${out}
        COMMAND ${CMAKE_CXX_COMPILER_LAUNCHER} ${CMAKE_CXX_COMPILER} -x hip --offload-arch=${arch}
                --cuda-device-only -nogpulib -S -std=c++20 -O2 -D__HIP_PLATFORM_AMD__=1
                -I${PROJECT_SOURCE_DIR} ${extra_inc} -MD -MF ${out}.d ${src} -o ${out}
        DEPENDS ${src}
        DEPFILE ${out}.d
        COMMENT "HIP device pass ${rel} (${arch})"
        VERBATIM)
      list(APPEND outs ${out})
    endforeach()
  endforeach()
  add_custom_target(hip_device_check ALL DEPENDS ${outs})
endfunction()
