# HORA_WITH_CUDA=ON: enables CUDA, picks the GPU architectures and finds
# NCCL, or stops the build with a message that says what was searched and
# how to fix it. A CPU-only build never includes this file.
#
# NCCL is searched in this order:
#   1. HORA_NCCL_HOME (CMake option), then the NCCL_HOME environment variable;
#   2. a system install (the CUDA toolkit's directories, /usr, /usr/local,
#      /usr/local/nccl, /opt/nccl);
#   3. the nvidia-nccl-cu<major> wheel in the Python environment hora is
#      being installed into (or in the build environment).
# Defines the target hora::cuda (CUDA runtime + NCCL) and the variables
# HORA_CUDA_RPATH and HORA_CUDA_ARCHITECTURES_USED.

set(HORA_NCCL_HOME "" CACHE PATH "Prefix of the NCCL installation to build against (include/nccl.h, lib/libnccl.so)")
set(HORA_CUDA_ARCHITECTURES "" CACHE STRING
    "GPU architectures to compile for (e.g. \"80;90\"); empty: a default list for the CUDA version")

# --- the CUDA compiler ---------------------------------------------------------
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_hora_nvcc nvcc PATHS /usr/local/cuda/bin /opt/cuda/bin NO_CACHE)
  if(_hora_nvcc)
    set(CMAKE_CUDA_COMPILER "${_hora_nvcc}")
  endif()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR
    "HORA_WITH_CUDA=ON, but no CUDA compiler (nvcc) was found.\n"
    "  Searched: CMAKE_CUDA_COMPILER, the CUDACXX environment variable, nvcc on PATH, "
    "/usr/local/cuda/bin and /opt/cuda/bin.\n"
    "  Fix: install the CUDA toolkit and put its bin directory on PATH (or set "
    "CUDACXX=/path/to/nvcc), or build without HORA_WITH_CUDA for a CPU-only hora.")
endif()

execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE _hora_nvcc_out)
string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _hora_release "${_hora_nvcc_out}")
set(HORA_CUDA_MAJOR "${CMAKE_MATCH_1}")
if(NOT HORA_CUDA_MAJOR)
  message(FATAL_ERROR "could not read the CUDA version from `${CMAKE_CUDA_COMPILER} --version`:\n${_hora_nvcc_out}")
endif()

# --- architectures: real code for each listed GPU generation, plus PTX for
# the newest so later GPUs can still JIT-compile the kernels.
if(HORA_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "${HORA_CUDA_ARCHITECTURES}")
elseif(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  if(HORA_CUDA_MAJOR GREATER_EQUAL 13)
    # CUDA 13 dropped Maxwell, Pascal and Volta.
    set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90-real;100-real;120")
  else()
    set(CMAKE_CUDA_ARCHITECTURES "70-real;75-real;80-real;86-real;89-real;90")
  endif()
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(HORA_CUDA_ARCHITECTURES_USED "${CMAKE_CUDA_ARCHITECTURES}")
find_package(CUDAToolkit REQUIRED)

# --- NCCL ----------------------------------------------------------------------
set(_hora_nccl_searched "")

# Sets _hora_nccl_include/_hora_nccl_library if `prefix` holds NCCL.
function(_hora_nccl_at prefix label)
  list(APPEND _hora_nccl_searched "${label}: ${prefix}")
  set(_hora_nccl_searched "${_hora_nccl_searched}" PARENT_SCOPE)
  if(NOT EXISTS "${prefix}/include/nccl.h")
    return()
  endif()
  foreach(dir lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
    foreach(name libnccl.so libnccl.so.2)
      if(EXISTS "${prefix}/${dir}/${name}")
        set(_hora_nccl_include "${prefix}/include" PARENT_SCOPE)
        set(_hora_nccl_library "${prefix}/${dir}/${name}" PARENT_SCOPE)
        set(HORA_NCCL_SOURCE "${label}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
endfunction()

set(_hora_nccl_include "")
set(_hora_nccl_library "")
# 1. explicit locations: a wrong one is an error, not a reason to look elsewhere
foreach(_explicit "HORA_NCCL_HOME;${HORA_NCCL_HOME}" "NCCL_HOME;$ENV{NCCL_HOME}")
  list(GET _explicit 0 _label)
  list(LENGTH _explicit _n)
  if(_n GREATER 1)
    list(GET _explicit 1 _prefix)
    if(_prefix AND NOT _hora_nccl_library)
      _hora_nccl_at("${_prefix}" "${_label}")
      if(NOT _hora_nccl_library)
        message(FATAL_ERROR "${_label}=${_prefix} does not hold NCCL: expected ${_prefix}/include/nccl.h "
                            "and ${_prefix}/lib/libnccl.so (or lib64/).")
      endif()
    endif()
  endif()
endforeach()
# 2. a system install
if(NOT _hora_nccl_library)
  set(_hora_toolkit_prefix "")
  if(CUDAToolkit_LIBRARY_ROOT)
    set(_hora_toolkit_prefix "${CUDAToolkit_LIBRARY_ROOT}")
  endif()
  foreach(_prefix ${_hora_toolkit_prefix} /usr /usr/local /usr/local/nccl /opt/nccl)
    if(NOT _hora_nccl_library)
      _hora_nccl_at("${_prefix}" "system")
    endif()
  endforeach()
endif()
# 3. the nvidia-nccl wheel: in the environment being installed into (python -I
# ignores the build isolation's path) and in the build environment itself
if(NOT _hora_nccl_library)
  set(_hora_pythons "")
  foreach(_var Python_EXECUTABLE Python3_EXECUTABLE PYTHON_EXECUTABLE)
    if(${_var})
      list(APPEND _hora_pythons "${${_var}}")
    endif()
  endforeach()
  if(DEFINED ENV{VIRTUAL_ENV})
    list(APPEND _hora_pythons "$ENV{VIRTUAL_ENV}/bin/python")
  endif()
  find_program(_hora_path_python NAMES python3 python NO_CACHE)
  if(_hora_path_python)
    list(APPEND _hora_pythons "${_hora_path_python}")
  endif()
  list(REMOVE_DUPLICATES _hora_pythons)
  foreach(_python ${_hora_pythons})
    # -I: the environment being installed into; plain: the build environment
    foreach(_isolated TRUE FALSE)
      if(_isolated)
        set(_args -I -c)
      else()
        set(_args -c)
      endif()
      execute_process(
        COMMAND "${_python}" ${_args} "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        OUTPUT_VARIABLE _site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_site AND NOT _hora_nccl_library)
        _hora_nccl_at("${_site}/nvidia/nccl" "nvidia-nccl-cu${HORA_CUDA_MAJOR} wheel")
      endif()
    endforeach()
  endforeach()
endif()

if(NOT _hora_nccl_library)
  list(REMOVE_DUPLICATES _hora_nccl_searched)
  list(JOIN _hora_nccl_searched "\n    " _hora_where)
  message(FATAL_ERROR
    "HORA_WITH_CUDA=ON, but NCCL was not found. Searched (include/nccl.h and lib/libnccl.so):\n"
    "    ${_hora_where}\n"
    "  Fix, one of:\n"
    "    pip install nvidia-nccl-cu${HORA_CUDA_MAJOR}   (into the environment you install hora into; "
    "scripts/install.sh does this when HORA_WITH_CUDA=1)\n"
    "    export NCCL_HOME=/path/to/nccl                  (a directory with include/ and lib/)\n"
    "    apt-get install libnccl-dev                     (NVIDIA's CUDA repository)")
endif()

file(STRINGS "${_hora_nccl_include}/nccl.h" _hora_nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
set(HORA_NCCL_VERSION "")
foreach(_line ${_hora_nccl_version_lines})
  string(REGEX MATCH "[0-9]+$" _v "${_line}")
  if(HORA_NCCL_VERSION)
    string(APPEND HORA_NCCL_VERSION ".${_v}")
  else()
    set(HORA_NCCL_VERSION "${_v}")
  endif()
endforeach()

add_library(hora_cuda_toolkit INTERFACE)
add_library(hora::cuda ALIAS hora_cuda_toolkit)
target_include_directories(hora_cuda_toolkit INTERFACE "${_hora_nccl_include}")
target_link_libraries(hora_cuda_toolkit INTERFACE CUDA::cudart_static "${_hora_nccl_library}")
# At run time NCCL comes from the wheel next to hora (site-packages/nvidia),
# else from where it was found at build time.
get_filename_component(_hora_nccl_libdir "${_hora_nccl_library}" DIRECTORY)
set(HORA_CUDA_RPATH "$ORIGIN/../nvidia/nccl/lib")
if(NOT HORA_NCCL_SOURCE MATCHES "wheel")
  list(APPEND HORA_CUDA_RPATH "${_hora_nccl_libdir}")
endif()
message(STATUS "hora: CUDA ${CMAKE_CUDA_COMPILER_VERSION} for architectures ${CMAKE_CUDA_ARCHITECTURES}; "
               "NCCL ${HORA_NCCL_VERSION} from ${HORA_NCCL_SOURCE} (${_hora_nccl_library})")
