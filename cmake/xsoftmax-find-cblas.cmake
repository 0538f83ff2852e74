# SPDX-License-Identifier: Apache-2.0
#
# xsoftmax_find_cblas(<out_var>)
#
# Finds a CBLAS (a BLAS library that exports cblas_* and a <cblas.h> to declare them) and, when
# both are found and cblas_sgemm links, creates the INTERFACE IMPORTED target `xsoftmax::cblas`
# (BLAS::BLAS + the directory of <cblas.h>) and sets <out_var> to TRUE; otherwise FALSE.
# Also sets XSOFTMAX_CBLAS_LIBRARIES and the cache entry XSOFTMAX_CBLAS_INCLUDE_DIR.
#
# Used by xsoftmax's own CMakeLists.txt and, installed, by xsoftmax-config.cmake, so that a
# consumer of the installed package resolves the same library the same way.
#
# Vendor: OpenBLAS unless BLA_VENDOR is already set (variable or environment). We want the OpenMP
# build of OpenBLAS: xsoftmax calls BLAS from inside its own OpenMP parallel regions, and an OpenMP
# OpenBLAS sharing our libgomp runs those calls single-threaded (nested parallelism is off) instead
# of oversubscribing the cores with its own pthreads. Debian/Ubuntu install the openmp, pthread and
# serial builds side by side in <libdir>/openblas-<variant>/ and let update-alternatives choose the
# one <libdir>/libopenblas.so points at, so we look in openblas-openmp/ first. The library found
# there lives outside the linker's default directories, so CMake gives executables an RPATH to it
# and they load that build at run time too, whatever the alternatives say.
include_guard(GLOBAL)

function(xsoftmax_find_cblas out_var)
  set(${out_var} FALSE PARENT_SCOPE)

  if(NOT DEFINED BLA_VENDOR AND NOT DEFINED ENV{BLA_VENDOR})
    set(BLA_VENDOR OpenBLAS)
  endif()
  if(DEFINED ENV{BLA_VENDOR} AND NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR "$ENV{BLA_VENDOR}")
  endif()

  # FindBLAS looks OpenBLAS up as the cache entry BLAS_openblas_LIBRARY and keeps a value already
  # there: seed it with the OpenMP build when there is one (a user-set value wins).
  if(BLA_VENDOR STREQUAL "OpenBLAS" AND NOT BLAS_openblas_LIBRARY)
    find_library(BLAS_openblas_LIBRARY NAMES openblas NAMES_PER_DIR PATH_SUFFIXES openblas-openmp)
  endif()

  if(xsoftmax_FIND_QUIETLY)
    set(_quiet QUIET)
  else()
    set(_quiet)
  endif()
  find_package(BLAS ${_quiet})
  if(NOT BLAS_FOUND OR NOT TARGET BLAS::BLAS)
    return()
  endif()

  # <cblas.h>: prefer the copy that belongs to the library found (Debian: the header of
  # <libdir>/openblas-openmp/ is <includedir>/<arch>/openblas-openmp/cblas.h).
  set(_suffixes)
  foreach(_lib IN LISTS BLAS_LIBRARIES)
    get_filename_component(_dir "${_lib}" DIRECTORY)
    get_filename_component(_variant "${_dir}" NAME)
    if(_variant MATCHES "^openblas")
      list(APPEND _suffixes "${_variant}")
    endif()
  endforeach()
  list(APPEND _suffixes openblas)
  list(REMOVE_DUPLICATES _suffixes)
  find_path(XSOFTMAX_CBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES ${_suffixes}
    DOC "Directory holding the <cblas.h> that matches the BLAS xsoftmax links")
  mark_as_advanced(XSOFTMAX_CBLAS_INCLUDE_DIR)
  if(NOT XSOFTMAX_CBLAS_INCLUDE_DIR)
    return()
  endif()

  # Some BLAS builds have no cblas_* symbols (the reference Fortran BLAS): check before use.
  include(CheckCXXSymbolExists)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_QUIET ON)
  set(CMAKE_REQUIRED_INCLUDES "${XSOFTMAX_CBLAS_INCLUDE_DIR}")
  set(CMAKE_REQUIRED_LIBRARIES ${BLAS_LIBRARIES} ${BLAS_LINKER_FLAGS})
  check_cxx_symbol_exists(cblas_sgemm cblas.h XSOFTMAX_CBLAS_SGEMM_LINKS)
  cmake_pop_check_state()
  if(NOT XSOFTMAX_CBLAS_SGEMM_LINKS)
    return()
  endif()

  if(NOT TARGET xsoftmax::cblas)
    add_library(xsoftmax::cblas INTERFACE IMPORTED)
    set_target_properties(xsoftmax::cblas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${XSOFTMAX_CBLAS_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES BLAS::BLAS)
  endif()
  set(XSOFTMAX_CBLAS_LIBRARIES "${BLAS_LIBRARIES}" PARENT_SCOPE)
  set(${out_var} TRUE PARENT_SCOPE)
endfunction()
